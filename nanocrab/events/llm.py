"""Model calls: request, streamed deltas (ephemeral), response, typed failure, compaction."""

from __future__ import annotations

from typing import ClassVar, Literal

from nanocrab.events.base import Event
from nanocrab.events.values import ContentBlock, Usage


class LlmRequested(Event, frozen=True, tag="llm.requested"):
    provider: str
    model: str
    tools: list[str] = []
    attempt: int = 1


class LlmDelta(Event, frozen=True, tag="llm.delta"):
    ephemeral: ClassVar[bool] = True

    index: int
    text: str


class LlmResponded(Event, frozen=True, tag="llm.responded"):
    provider: str
    model: str
    content: list[ContentBlock]
    stop_reason: str
    usage: Usage = Usage()
    cost_usd: float = 0.0
    latency_ms: float = 0.0


class LlmFailed(Event, frozen=True, tag="llm.failed"):
    """``overflow`` → compact and retry once; ``retryable`` → backoff; ``fatal`` → fail the run."""

    kind: Literal["overflow", "retryable", "fatal"]
    message: str
    status_code: int | None = None
    attempts: int = 1


class ContextCompacted(Event, frozen=True, tag="context.compacted"):
    summary: str
    turns_summarised: int
    tokens_before: int = 0
    tokens_after: int = 0
