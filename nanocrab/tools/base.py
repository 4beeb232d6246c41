"""What a tool is: a name, a pydantic argument schema, and ``run(args, ctx) -> ToolResult``.

Tools know nothing of the bus. The executor handler gives them a :class:`ToolContext` (the run's
workspace, the operations backend, an output sink for streaming, an artifact store, a cancel
signal) and turns the :class:`ToolResult` into a ``tool.completed`` event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import msgspec
from pydantic import BaseModel, ConfigDict

from nanocrab.events import (
    ArtifactRef,
    ImageBlock,
    TextBlock,
    ToolDetails,
    ToolErrorKind,
)
from nanocrab.tools.hosts import HostAllowList

if TYPE_CHECKING:
    from nanocrab.tools.confine import Confinement
    from nanocrab.tools.ops import Operations

OutputSink = Callable[[Literal["stdout", "stderr"], str], Awaitable[None]]


class ToolError(Exception):
    """Raised inside a tool for an expected failure; becomes ``ToolResult(is_error=True)``."""

    def __init__(self, kind: ToolErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ToolErrorKind = kind
        self.message = message


class ArtifactStore(Protocol):
    """Where large outputs go (the JetStream Object Store in the runtime)."""

    async def put(
        self, name: str, data: bytes, *, media_type: str = "text/plain", preview: str = ""
    ) -> ArtifactRef: ...


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """Structured result: what the model sees (``content``), typed ``details`` for people and
    programs, ``artifacts`` for large payloads, and a typed error when ``is_error``."""

    content: list[TextBlock | ImageBlock]
    details: ToolDetails | None = None
    artifacts: list[ArtifactRef] = []
    is_error: bool = False
    error_kind: ToolErrorKind | None = None

    @classmethod
    def text(cls, text: str, **kwargs: Any) -> ToolResult:
        return cls(content=[TextBlock(text)], **kwargs)

    @classmethod
    def error(cls, kind: ToolErrorKind, message: str, **kwargs: Any) -> ToolResult:
        return cls(content=[TextBlock(message)], is_error=True, error_kind=kind, **kwargs)


async def _discard(stream: Literal["stdout", "stderr"], chunk: str) -> None:
    return None


@dataclass(kw_only=True)
class ToolContext:
    """Everything a tool may touch. ``workspace`` is already a resolved real path."""

    workspace: Path
    ops: Operations
    artifacts: ArtifactStore
    emit_output: OutputSink = _discard
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    timeout_s: float = 120.0
    run_id: str = ""
    call_id: str = ""
    # Hosts the call's grant covers; network tools must stay within it (the first URL and every
    # redirect hop), on top of their own allow-list. None: no restriction beyond the tool's own.
    allowed_hosts: HostAllowList | None = None
    # How exec confines its command (nanocrab.tools.confine): the executor derives it from the
    # grant and the policy. None: the strictest default, a Safe call with no network.
    confinement: Confinement | None = None
    # The resources the call's grant names (the executor sets them): a tool whose target can
    # change after the decision (a capability's code) runs only what the grant names. None:
    # not run under a grant (a tool used directly).
    granted: tuple[str, ...] | None = None


class ToolArgs(BaseModel):
    """Base for argument schemas: unknown arguments are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class Tool(Protocol):
    """A tool. ``name`` is canonical (``read``, ``exec``); ``group`` orders the catalogue.

    ``idempotent`` is true only when running a call twice has no effect beyond running it once
    (read-only tools). After a crash the executor re-runs such a call; any other call whose start
    is in the log without a result is reported ``interrupted``, never run twice. Every tool says
    which it is: a side effect run twice is the failure this field exists to prevent, so there is
    no default to forget.
    """

    name: ClassVar[str]
    group: ClassVar[str]
    description: ClassVar[str]
    args_model: ClassVar[type[ToolArgs]]
    idempotent: ClassVar[bool]

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult: ...


def is_idempotent(tool: Tool) -> bool:
    """Whether a crashed call of ``tool`` may simply be run again."""
    return tool.idempotent
