"""The model interface every provider implements: a request in, a streamed response out.

Failures are typed (:class:`LlmError` with ``kind`` overflow / retryable / fatal) so the LLM
handler can compact, retry or fail the run without parsing strings.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import msgspec

from nanocrab.events import ContentBlock, ToolResultBlock, Usage

DeltaSink = Callable[[str], Awaitable[None]]
"""Receives text deltas as they stream (the handler forwards them to the ephemeral stream)."""

LlmErrorKind = Literal["overflow", "retryable", "fatal"]


DEFAULT_MODEL = "claude-sonnet-4-6"
"""The Claude model the ``anthropic`` provider uses unless told otherwise."""


class Message(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["user", "assistant"]
    content: list[ContentBlock | ToolResultBlock]


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as the model sees it: name, description, JSON Schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    system: str
    messages: list[Message]
    tools: list[ToolSpec] = []
    model: str = ""
    max_tokens: int = 4096
    run_id: str = ""
    turn: int = 0  # index of this call within the run (the scripted and replay models key on it)
    task: str = ""  # the run's task text (the scripted model picks its script by it)
    # the bytes of the messages' image blocks, by artifact key, read from the object store by
    # the LLM handler for this call only (a provider without one shows a placeholder)
    images: dict[str, bytes] = {}


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True):
    content: list[ContentBlock]
    stop_reason: str
    usage: Usage = Usage()
    model: str = ""
    cost_usd: float = 0.0


class LlmError(Exception):
    """A classified model failure. ``status_code`` is the HTTP status when there was one;
    ``retry_after`` is the wait in seconds the server asked for (``retry-after``), when it did."""

    def __init__(
        self,
        kind: LlmErrorKind,
        message: str,
        *,
        status_code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind: LlmErrorKind = kind
        self.message = message
        self.status_code = status_code
        self.retry_after = retry_after


class LlmConfigError(LlmError):
    """A provider that cannot work as configured (unknown provider, bad script file, missing
    credentials). Raised when the provider is built, so start-up fails with a message that says
    what to fix instead of every run failing later. Always ``fatal``."""

    def __init__(self, message: str) -> None:
        super().__init__("fatal", message)


class Provider(Protocol):
    name: str

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        """One model call. Raises :class:`LlmError` on failure; never retries by itself (the
        handler owns retries so that every attempt is visible)."""
        ...
