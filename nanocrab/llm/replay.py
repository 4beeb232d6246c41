"""Re-run a past run against new code: the model's answers come from that run's recording.

Each ``llm.responded`` event is served again for the request with the same ``turn`` (content,
stop reason, usage and model as recorded; the text is streamed through ``on_delta`` as the live
run streamed it). The cost is 0.0: a replay spends nothing, and counting the original cost again
would double it in usage reports. If one turn was recorded more than once (a redelivered event),
the last recording wins.

A re-run is a new run, never a copy of the old one's identities: every ``tool_use`` id is
replaced by one derived from the new run and the recorded id, so the re-run's calls get their
own approvals, grants and audit rows. Subagents are re-run too: a recording holds the child
runs' answers as well (``from_events`` of the whole tree), and a new child is matched to the
recorded child its ``spawn`` call stands for (both ids derive from parent run and call id:
:func:`~nanocrab.events.child_run_id`). The first run that asks is the re-run of the root.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from nanocrab.events import (
    ContentBlock,
    Event,
    LlmResponded,
    TextBlock,
    ToolUseBlock,
    child_run_id,
    derive_event_id,
)
from nanocrab.llm.base import DeltaSink, LlmError, ModelRequest, ModelResponse
from nanocrab.llm.scripted import stream_chunks


class ReplayProvider:
    """Serves a recorded run tree's responses by (run, ``request.turn``); a turn with no
    recording is ``fatal``. ``root`` is the recorded run the first new run stands for (default:
    the first run of ``responses`` that no other recorded run spawned)."""

    name = "replay"

    def __init__(self, responses: Sequence[LlmResponded], *, root: str | None = None) -> None:
        self._recorded: dict[str, dict[int, LlmResponded]] = {}
        for r in responses:
            self._recorded.setdefault(r.run_id or "", {})[r.turn] = r
        self._run_ids = sorted(k for k in self._recorded if k)
        self._root = root if root is not None else self._guess_root(responses)
        self._stands_for: dict[str, str] = {}  # new run id → recorded run id
        self._root_claimed = False

    @classmethod
    def from_events(cls, events: Iterable[Event], *, root: str | None = None) -> ReplayProvider:
        """From a run's whole event history (and its subagents'); everything but
        ``llm.responded`` is ignored."""
        return cls([e for e in events if isinstance(e, LlmResponded)], root=root)

    @property
    def turns(self) -> list[int]:
        """The recorded turns of the root run."""
        return sorted(self._recorded.get(self._root, {}))

    def _guess_root(self, responses: Sequence[LlmResponded]) -> str:
        children = {
            child_run_id(r.run_id or "", b.id)
            for r in responses
            for b in r.content
            if isinstance(b, ToolUseBlock)
        }
        roots = [r.run_id or "" for r in responses if (r.run_id or "") not in children]
        return roots[0] if roots else ""

    def _recording_of(self, run_id: str) -> str | None:
        known = self._stands_for.get(run_id)
        if known is not None:
            return known
        if not self._root_claimed:
            self._root_claimed = True
            self._stands_for[run_id] = self._root
            return self._root
        return None

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        source = self._recording_of(request.run_id)
        recorded = self._recorded.get(source or "", {}).get(request.turn)
        if recorded is None:
            run = source or ", ".join(self._run_ids) or request.run_id or "(unknown)"
            raise LlmError(
                "fatal",
                f"no recorded response for turn {request.turn} of run {run}; the new code asked "
                f"for more turns than the recording has (recorded turns: {self._describe_turns()})",
            )
        if on_delta is not None:
            for block in recorded.content:
                if isinstance(block, TextBlock):
                    for chunk in stream_chunks(block.text):
                        await on_delta(chunk)
        return ModelResponse(
            content=self._renamed(recorded, request.run_id),
            stop_reason=recorded.stop_reason,
            usage=recorded.usage,
            model=recorded.model,
        )

    def _renamed(self, recorded: LlmResponded, run_id: str) -> list[ContentBlock]:
        """The recorded content with every tool call under a new id of this run; a call that
        spawns a subagent maps that future child to the recorded one."""
        out: list[ContentBlock] = []
        for block in recorded.content:
            if isinstance(block, ToolUseBlock):
                new_id = "toolu_" + derive_event_id("rerun", f"{run_id}/{block.id}", 0)
                self._stands_for[child_run_id(run_id, new_id)] = child_run_id(
                    recorded.run_id or "", block.id
                )
                block = msgspec.structs.replace(block, id=new_id)
            out.append(block)
        return out

    def _describe_turns(self) -> str:
        turns = self.turns
        if not turns:
            return "none"
        if turns == list(range(turns[0], turns[-1] + 1)):
            return f"{turns[0]}-{turns[-1]}" if len(turns) > 1 else str(turns[0])
        return ", ".join(map(str, turns))
