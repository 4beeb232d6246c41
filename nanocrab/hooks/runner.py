"""Running the configured hooks at their points, turning each one's effect into ``hook.applied``.

:class:`Hooks` is what the handlers hold: the LLM handler calls :meth:`Hooks.before_model`, the
executor :meth:`Hooks.after_tool`, the hooks handler :meth:`Hooks.run_end`. Each returns the
(possibly changed) value and one :class:`~nanocrab.events.HookApplied` per hook that changed
it, annotated it or failed; a hook that left everything as it was leaves no event.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from nanocrab.events import HookApplied, HookPoint, ImageBlock, TextBlock, ToolResultBlock
from nanocrab.hooks.api import ModelContext, RunEnd, ToolOutcome
from nanocrab.hooks.config import HooksFile, HookSpec, read_hooks, resolve
from nanocrab.llm.base import ModelRequest
from nanocrab.tools.base import ToolResult

log = logging.getLogger(__name__)

MAX_DIFF_CHARS = 4000


@dataclass(frozen=True, slots=True)
class Hook:
    """One configured hook with its imported function."""

    spec: HookSpec
    function: Any

    def applies(self, *, agent: str | None = None, tool: str | None = None) -> bool:
        if self.spec.agents is not None and agent is not None and agent not in self.spec.agents:
            return False
        if self.spec.tools is not None and tool is not None:
            return any(fnmatch.fnmatchcase(tool, p) for p in self.spec.tools)
        return True


class Hooks:
    """The hooks of one configuration, by point, in file order."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self.hooks = tuple(hooks)

    @classmethod
    def load(cls, config: HooksFile) -> Hooks:
        """Import every hook's function (``HookConfigError`` naming a bad one)."""
        return cls([Hook(spec, resolve(spec)) for spec in config.hooks])

    @classmethod
    def from_file(cls, path: Path) -> Hooks:
        """The hooks of the file at ``path``, imported (``HookConfigError`` saying what to fix)."""
        return cls.load(read_hooks(path))

    def at(self, point: HookPoint) -> list[Hook]:
        return [h for h in self.hooks if h.spec.point == point]

    def __bool__(self) -> bool:
        return bool(self.hooks)

    async def before_model(
        self, request: ModelRequest, *, agent: str
    ) -> tuple[ModelRequest, list[HookApplied]]:
        """``request`` with its system prompt and messages as the ``before_model`` hooks left
        them, and what each did."""
        events: list[HookApplied] = []
        ctx = ModelContext(
            run_id=request.run_id, agent=agent, turn=request.turn, system=request.system,
            messages=list(request.messages),
        )  # fmt: skip
        for hook in self.at("before_model"):
            if not hook.applies(agent=agent):
                continue
            out, error = await _call(hook, ctx)
            if error is None and (out is None or out == ctx):
                continue
            new = out if isinstance(out, ModelContext) else ctx
            if error is None and not isinstance(out, ModelContext):
                error = f"returned {type(out).__name__}, not a ModelContext or None"
                new = ctx
            summary = _context_summary(ctx, new)
            events.append(
                _applied(hook, _context_text(ctx), _context_text(new), _digest(ctx), _digest(new),
                         error=error, summary=summary, turn=request.turn)
            )  # fmt: skip
            ctx = new
        if not events:
            return request, events
        changed = msgspec.structs.replace(request, system=ctx.system, messages=ctx.messages)
        return changed, events

    async def after_tool(
        self, outcome: ToolOutcome, *, agent: str | None = None
    ) -> tuple[ToolOutcome, list[HookApplied]]:
        """``outcome`` as the ``after_tool`` hooks for its tool left it, and what each did.
        The returned outcome's ``note`` is the last hook's note (all are in the events)."""
        events: list[HookApplied] = []
        current = outcome
        for hook in self.at("after_tool"):
            if not hook.applies(agent=agent, tool=outcome.tool):
                continue
            clean = msgspec.structs.replace(current, note="")
            out, error = await _call(hook, clean)
            if error is None and (out is None or out == clean):
                continue
            new = out if isinstance(out, ToolOutcome) else clean
            if error is None and not isinstance(out, ToolOutcome):
                error = f"returned {type(out).__name__}, not a ToolOutcome or None"
                new = clean
            # the call it answers cannot be changed by a hook, only what the model reads
            new = msgspec.structs.replace(
                new, run_id=outcome.run_id, call_id=outcome.call_id, tool=outcome.tool
            )
            before, after = _text(clean.content), _text(new.content)
            changed = new.content != clean.content or new.is_error != clean.is_error
            summary = (
                f"content {len(before)}→{len(after)} chars"
                + (f", is_error {clean.is_error}→{new.is_error}"
                   if new.is_error != clean.is_error else "")
                if changed else "annotated"
            )  # fmt: skip
            events.append(_applied(hook, before, after, _digest(clean.content),
                                   _digest(new.content), error=error, summary=summary,
                                   note=new.note, call_id=outcome.call_id,
                                   tool=outcome.tool))  # fmt: skip
            current = new
        return current, events

    async def after_result(
        self, result: ToolResult, *, run_id: str, call_id: str, tool: str, agent: str | None = None
    ) -> tuple[ToolResult, list[HookApplied]]:
        """:meth:`after_tool` on a tool's result: its content and error flag as the hooks left
        them (an error without a kind becomes ``failed``; a result no longer an error has none)."""
        outcome = ToolOutcome(
            run_id=run_id, call_id=call_id, tool=tool, content=list(result.content),
            is_error=result.is_error,
        )  # fmt: skip
        new, events = await self.after_tool(outcome, agent=agent)
        if not events or (new.content == outcome.content and new.is_error == outcome.is_error):
            return result, events
        kind = (result.error_kind or "failed") if new.is_error else None
        changed = msgspec.structs.replace(
            result, content=new.content, is_error=new.is_error, error_kind=kind
        )
        return changed, events

    async def run_end(self, end: RunEnd, *, agent: str | None = None) -> list[HookApplied]:
        """One event per ``run_end`` hook that returned a note (or failed)."""
        events: list[HookApplied] = []
        for hook in self.at("run_end"):
            if not hook.applies(agent=agent):
                continue
            out, error = await _call(hook, end)
            if error is None and out is None:
                continue
            if error is None and not isinstance(out, str):
                error = f"returned {type(out).__name__}, not a str or None"
            note = out if isinstance(out, str) else ""
            digest = _digest(end)
            events.append(_applied(hook, "", "", digest, digest, error=error,
                                   summary=f"run {end.status}", note=note))  # fmt: skip
        return events


async def _call(hook: Hook, value: object) -> tuple[object, str | None]:
    """The hook's answer, or ``(None, what it raised)``: a hook is third-party code, and its
    failure is recorded rather than failing the step it extends."""
    try:
        out = hook.function(value)
        if inspect.isawaitable(out):
            out = await out
    except Exception as exc:  # recorded in hook.applied.error, never swallowed silently
        log.exception("hook %s failed", hook.spec.name)
        return None, f"{type(exc).__name__}: {exc}"
    return out, None


def _applied(
    hook: Hook, before_text: str, after_text: str, before: str, after: str, **fields: Any
) -> HookApplied:
    diff = "".join(
        difflib.unified_diff(
            before_text.splitlines(keepends=True), after_text.splitlines(keepends=True),
            "before", "after", n=1,
        )
    )  # fmt: skip
    if len(diff) > MAX_DIFF_CHARS:
        diff = diff[:MAX_DIFF_CHARS] + f"\n[… diff cut at {MAX_DIFF_CHARS} chars]"
    return HookApplied(
        hook=hook.spec.name, point=hook.spec.point, before=before, after=after, diff=diff,
        **fields,
    )  # fmt: skip


def _digest(value: object) -> str:
    return hashlib.sha256(msgspec.json.encode(value)).hexdigest()[:16]


def _text(content: Sequence[object]) -> str:
    lines = []
    for block in content:
        if isinstance(block, TextBlock):
            lines.append(block.text)
        elif isinstance(block, ImageBlock):
            lines.append(f"[image {block.media_type} {block.artifact}]")
        elif isinstance(block, ToolResultBlock):
            lines.append(f"[result of {block.tool_use_id}]\n{_text(block.content)}")
        else:
            lines.append(msgspec.json.encode(block).decode())
    return "\n".join(lines)


def _context_text(ctx: ModelContext) -> str:
    parts = [f"# system\n{ctx.system}"]
    parts += [f"# {m.role}\n{_text(m.content)}" for m in ctx.messages]
    return "\n".join(parts) + "\n"


def _context_summary(old: ModelContext, new: ModelContext) -> str:
    bits = []
    if new.system != old.system:
        bits.append(f"system {len(old.system)}→{len(new.system)} chars")
    if len(new.messages) != len(old.messages):
        bits.append(f"messages {len(old.messages)}→{len(new.messages)}")
    else:
        changed = sum(a != b for a, b in zip(old.messages, new.messages, strict=True))
        if changed:
            bits.append(f"{changed} of {len(old.messages)} messages changed")
    return "; ".join(bits) or "unchanged"


__all__ = ["Hook", "Hooks"]
