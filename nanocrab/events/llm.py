"""Model calls: request, streamed deltas (ephemeral), response, typed failure, compaction."""

from __future__ import annotations

from typing import ClassVar, Literal

from nanocrab.events.base import Event
from nanocrab.events.values import ContentBlock, Usage


class LlmRequested(Event, frozen=True, tag="llm.requested"):
    """Ask the model for the next turn. The LLM handler rebuilds the conversation from the run's
    events (and the session's earlier runs), so requests stay small however long the run gets."""

    turn: int  # 0-based index of this model call within the run
    delivers: list[str] = []  # ids of message.queued events (steer / follow-up) given to this turn
    tools: list[str] = []  # tools enabled for the run, by canonical name
    model: str = ""


class LlmDelta(Event, frozen=True, tag="llm.delta"):
    ephemeral: ClassVar[bool] = True

    index: int
    text: str


class LlmResponded(Event, frozen=True, tag="llm.responded"):
    provider: str
    model: str
    content: list[ContentBlock]
    stop_reason: str
    turn: int = 0
    usage: Usage = Usage()
    cost_usd: float = 0.0
    latency_ms: float = 0.0


class AgentResponded(LlmResponded, frozen=True, tag="agent.responded"):
    """A Python agent's answer to its run's turn, in the model's place (``handlers/pyagent.py``):
    the fields of :class:`LlmResponded`, a subclass, so whatever reads a turn's answer reads
    both. Only the ``pyagent`` identity publishes it, and a run believes it only when its
    ``run.started`` says a Python agent drives it (``driver: python``) — as it believes an
    ``llm.responded`` only when a model does: hosted agent code cannot answer other runs' turns."""


class LlmFailed(Event, frozen=True, tag="llm.failed"):
    """``overflow`` → compact and retry once; ``retryable`` → backoff; ``fatal`` → fail the run;
    ``agent``: a Python agent playing the model's part failed (it raised, returned no
    ``Response``, timed out, or could not be loaded) → ``run.failed{kind: agent}``."""

    kind: Literal["overflow", "retryable", "fatal", "agent"]
    message: str
    turn: int = 0
    will_retry: bool = False  # an attempt that failed; the handler tries again
    status_code: int | None = None
    attempts: int = 1
    # failover (nanocrab/llm/failover.py): the model that failed, and the one the call moved
    # to (``provider/model`` or ``model``; empty: no move) — then ``will_retry`` is true
    model: str = ""
    failover_to: str = ""


class ContextCompacted(Event, frozen=True, tag="context.compacted"):
    """Older turns of the run are replaced by ``summary`` from now on: every event of the run up
    to and including ``upto_event_id`` is represented by it; later events are kept verbatim."""

    summary: str
    turns_summarised: int
    upto_event_id: str = ""
    tokens_before: int = 0
    tokens_after: int = 0
