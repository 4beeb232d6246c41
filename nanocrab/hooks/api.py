"""What a hook is given and may return: the typed interface for extension code.

A hook is a plain function (or coroutine function) named in ``hooks.yaml`` as
``module:function``, at one of three points:

``before_model(ctx: ModelContext) -> ModelContext | None``
    just before a model call: return a changed context (system prompt, messages) or ``None``
    to leave it as it is.
``after_tool(result: ToolOutcome) -> ToolOutcome | None``
    after a tool ran, before its result is recorded: return the result with changed
    ``content`` (what the model will read) and/or a ``note`` (an annotation for people, kept
    in the log only), or ``None``.
``run_end(end: RunEnd) -> str | None``
    when a run has ended: return a note to record, or ``None``.

Values are frozen: build a changed one with ``msgspec.structs.replace``. A hook that raises is
recorded (``hook.applied`` with ``error``) and its input is used unchanged: hooks extend the
agent, they are not a security boundary (use the policy and the guardrails for that).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

from nanocrab.events import ImageBlock, TextBlock
from nanocrab.llm.base import Message


class ModelContext(msgspec.Struct, frozen=True, kw_only=True):
    """The context of one model call: the system prompt and the conversation."""

    run_id: str
    agent: str
    turn: int
    system: str
    messages: list[Message]


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call's result as the model will read it; ``note`` annotates it for people."""

    run_id: str
    call_id: str
    tool: str
    content: list[TextBlock | ImageBlock]
    is_error: bool = False
    note: str = ""


class RunEnd(msgspec.Struct, frozen=True, kw_only=True):
    """How a run ended: its answer when completed, why not otherwise."""

    run_id: str
    status: Literal["completed", "failed", "cancelled"]
    reply: str = ""
    reason: str = ""


BeforeModel = Callable[[ModelContext], ModelContext | Awaitable[ModelContext | None] | None]
AfterTool = Callable[[ToolOutcome], ToolOutcome | Awaitable[ToolOutcome | None] | None]
OnRunEnd = Callable[[RunEnd], str | Awaitable[str | None] | None]
