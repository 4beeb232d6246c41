"""The ``capability`` tool: run an enabled, generated capability in the WebAssembly sandbox.

Capabilities are generated, scanned and tested by the capgen handler and switched on with
``nanocrab capabilities enable``. The tool looks one up by name through an injected
:data:`Lookup` (the registry read model in the runtime; the tools layer knows no database),
validates the arguments against its JSON Schema, and calls its entry function in the sandbox
with the workspace mounted only as its declared permissions say (``fs.read`` read-only,
``fs.write`` writable, nothing otherwise) — only the exact code its grant names
(``capabilities/pin.py``). The result carries :class:`CapabilityDetails`, from
which the executor records ``capability.invoked`` for the registry's statistics. The policy
derives the call's tier from the same declared permissions.

The catalogue (``name="list"``) shows each capability's ``user_guidance`` and what it
``requires``; a capability whose dependency chain is not all enabled, or that declares a
permission the configuration no longer permits, is listed as unavailable (``blocked``, with the
reason) and refused when called.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from nanocrab.capabilities.invoke import argument_errors, invoke
from nanocrab.capabilities.pin import pin, pins
from nanocrab.events import CapabilityDetails, TextBlock, ToolErrorKind
from nanocrab.sandbox import Limits, Mount, Sandbox
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult

WORKSPACE_GUEST = "/workspace"
LIMITS = Limits(fuel=20_000_000_000, timeout_s=10.0, output_bytes=32 * 1024)
_MAX_VALUE_CHARS = 16_000


@dataclass(frozen=True)
class EnabledCapability:
    name: str
    version: str
    description: str
    entry: str
    parameters: dict[str, Any]
    permissions: tuple[str, ...]
    source: str
    user_guidance: str = ""
    requires: tuple[str, ...] = ()
    blocked: str = ""  # why it may not run now (a dependency not enabled, ...); "" if it may

    @property
    def pin(self) -> str:
        """The resource naming exactly this code (``capabilities/pin.py``)."""
        return pin(self.name, self.version, self.source, self.entry, self.permissions)


Lookup = Callable[[str], Awaitable[EnabledCapability | None]]
Catalogue = Callable[[], Awaitable[Sequence[EnabledCapability]]]


class CapabilityArgs(ToolArgs):
    name: str = Field(
        min_length=1, description='The capability to run, or "list" to see the enabled ones.'
    )
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments, as the capability's schema says."
    )


class CapabilityTool:
    name: ClassVar[str] = "capability"
    group: ClassVar[str] = "code"
    description: ClassVar[str] = (
        "Run a capability: a small Python function that was generated, safety-scanned and "
        "tested with `nanocrab capabilities`, executed in the WebAssembly sandbox (no network; "
        'the workspace only if it declared so). Call with name="list" first to see the '
        "enabled capabilities, their descriptions and parameters."
    )
    args_model: ClassVar[type[ToolArgs]] = CapabilityArgs
    idempotent: ClassVar[bool] = False  # generated code may write (fs.write)

    def __init__(
        self, sandbox: Sandbox, *, lookup: Lookup, catalogue: Catalogue, limits: Limits = LIMITS
    ) -> None:
        self.sandbox = sandbox
        self.lookup = lookup
        self.catalogue = catalogue
        self.limits = limits

    async def run(self, args: CapabilityArgs, ctx: ToolContext) -> ToolResult:
        if args.name == "list":
            return await self._list()
        cap = await self.lookup(args.name)
        if cap is None:
            raise ToolError(
                "not_found",
                f'no enabled capability {args.name!r}; call capability with name="list"',
            )
        if cap.blocked:
            raise ToolError("denied", f"{cap.name} cannot run now: {cap.blocked}")
        if ctx.granted is not None and cap.pin not in pins(ctx.granted):
            granted = ", ".join(pins(ctx.granted)) or "no capability"
            raise ToolError(
                "denied",
                f"{cap.name} is now version {cap.version} ({cap.pin}); the grant is for "
                f"{granted}: call it again to have this version decided",
            )
        if problems := argument_errors(cap.parameters, args.arguments):
            raise ToolError("invalid_arguments", f"{cap.name}: " + "; ".join(problems))
        result, run = await invoke(
            self.sandbox, name=cap.name, version=cap.version, code=cap.source, entry=cap.entry,
            arguments=args.arguments, mounts=_mounts(cap, ctx), limits=self.limits,
        )  # fmt: skip
        box = result.sandbox
        details = CapabilityDetails(
            name=run.name, version=run.version, ok=run.ok, outcome=run.outcome,
            duration_ms=run.duration_ms, peak_memory_bytes=run.peak_memory_bytes,
            fuel_used=run.fuel_used, error=run.error,
        )  # fmt: skip
        if not result.ok:
            kind: ToolErrorKind = "timeout" if box.outcome == "timeout" else "failed"
            text = f"{cap.name} {cap.version} failed ({box.outcome}): {run.error}"
            if box.stderr.strip():
                text += f"\nstderr:\n{box.stderr[-2000:]}"
            return ToolResult(
                content=[TextBlock(text)], details=details, is_error=True, error_kind=kind
            )
        shown = json.dumps(result.value, ensure_ascii=False, indent=1)
        if len(shown) > _MAX_VALUE_CHARS:
            shown = shown[:_MAX_VALUE_CHARS] + "\n[… cut]"
        text = shown if not box.stdout.strip() else f"{shown}\nstdout:\n{box.stdout[-2000:]}"
        return ToolResult(content=[TextBlock(text)], details=details)

    async def _list(self) -> ToolResult:
        caps = await self.catalogue()
        if not caps:
            return ToolResult(
                content=[TextBlock("no capabilities are enabled (`nanocrab capabilities list`)")]
            )
        return ToolResult(content=[TextBlock("\n".join(_entry(c) for c in caps))])


def _entry(c: EnabledCapability) -> str:
    """One capability in the catalogue the model sees."""
    lines = [
        f"- {c.name} {c.version}: {c.description}",
        f"  parameters: {json.dumps(c.parameters.get('properties', {}))}",
    ]
    if c.user_guidance:
        lines.append(f"  guidance: {c.user_guidance}")
    if c.permissions:
        lines.append(f"  permissions: {', '.join(c.permissions)}")
    if c.requires:
        lines.append(f"  requires: {', '.join(c.requires)}")
    if c.blocked:
        lines.append(f"  unavailable: {c.blocked}")
    return "\n".join(lines)


def _mounts(cap: EnabledCapability, ctx: ToolContext) -> list[Mount]:
    if "fs.write" in cap.permissions:
        return [Mount(ctx.workspace, WORKSPACE_GUEST, writable=True)]
    if "fs.read" in cap.permissions:
        return [Mount(ctx.workspace, WORKSPACE_GUEST)]
    return []
