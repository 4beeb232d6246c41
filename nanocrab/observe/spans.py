"""A run's events as OpenTelemetry GenAI spans: a pure function of the event that closes a span
and the run's folded state.

Which event closes which span (each span is exported once, when its last event is in):

==========================  =============================  ======================================
span                        closed by                      start → end
==========================  =============================  ======================================
``invoke_agent {agent}``    run.completed/failed/cancelled  run.started (task.submitted) → outcome
``chat {model}``            llm.responded, llm.failed       response minus its latency → response
``execute_tool {tool}``     tool.completed                  tool.started → tool.completed
``policy {tool}``           grant.issued / grant.denied     tool.requested → the decision
``approval {tool}``         the first answer                approval.requested → the answer
``guardrail {checkpoint}``  guardrail.checked               verdict minus its duration
``budget {scope}``          budget.exceeded                 an instant (``approval budget``: the
                                                           wait for more, when the cap asks)
==========================  =============================  ======================================

Ids are derived, never random: the trace is the one the run's ``task.submitted`` carries (its
``traceparent``), ``invoke_agent``'s span id is a hash of the run id and its parent is the span
that published the task; every other span's id is a hash of its closing event's id and its
parent is ``invoke_agent``. So any telemetry instance, in any process, exports the same spans
for the same run, and the handlers' own messaging spans (which continue the task's trace hop
by hop) sit in the same trace. Message content (the model's answer, tool arguments and results)
is recorded only when ``content`` is set (opt-in).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

import msgspec

from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    BudgetExceeded,
    Event,
    GrantDenied,
    GrantIssued,
    GuardrailChecked,
    LlmFailed,
    LlmResponded,
    RunCancelled,
    RunCompleted,
    RunFailed,
    TextBlock,
    ToolCompleted,
)
from nanocrab.handlers.runstate import RunState, TurnState
from nanocrab.observe import semconv as sc

Attr = str | bool | int | float | list[str]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CONTENT_CHARS = 4000
"""Opt-in content is cut to this many characters per attribute (the log keeps it whole)."""


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One finished span, ready for an exporter (``export.py`` turns it into the SDK's)."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    kind: Literal["internal", "client"] = "internal"
    attributes: dict[str, Attr] = field(default_factory=dict)
    error: str | None = None  # the span's status description when it failed


def derived_id(*parts: str, bits: int = 64) -> int:
    """A non-zero id hashed from ``parts`` (span ids: 64 bits, trace ids: 128)."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=bits // 8).digest()
    return int.from_bytes(digest, "big") or 1


def ns(t: datetime) -> int:
    """Nanoseconds since the epoch, exactly (a float timestamp loses the microseconds)."""
    return (t - _EPOCH) // timedelta(microseconds=1) * 1000


def run_context(state: RunState) -> tuple[int, int | None]:
    """The run's trace id and the span ``invoke_agent`` hangs from: the task's ``traceparent``
    (the span that published it), else a trace id derived from the run id and no parent."""
    trace = state.task.trace if state.task is not None else None
    if trace:
        parts = trace.split("-")
        if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
            try:
                return int(parts[1], 16), int(parts[2], 16) or None
            except ValueError:
                pass
    return derived_id("trace", state.run_id, bits=128), None


def agent_span_id(run_id: str) -> int:
    return derived_id("invoke_agent", run_id)


def spans_for(event: Event, state: RunState, *, content: bool = False) -> list[SpanRecord]:
    """The spans ``event`` closes in its run (``state``: the run folded up to ``event``)."""
    if state.task is None:
        return []
    trace_id, _ = run_context(state)
    parent = agent_span_id(state.run_id)
    common: dict[str, Attr] = {sc.RUN_ID: state.run_id, sc.TENANT: state.task.tenant}
    if state.task.session_id:
        common[sc.CONVERSATION] = state.task.session_id

    def span(
        name: str,
        start: datetime,
        end: datetime,
        attrs: dict[str, Attr],
        kind: Literal["internal", "client"] = "internal",
        error: str | None = None,
    ) -> SpanRecord:
        return SpanRecord(
            name=name,
            trace_id=trace_id,
            span_id=derived_id("span", event.id),
            parent_id=parent,
            start_ns=ns(min(start, end)),
            end_ns=ns(end),
            kind=kind,
            attributes={**common, **attrs},
            error=error,
        )

    match event:
        case LlmResponded():
            turn = _turn(state, event.turn)
            return [_chat(event, turn, span, content)]
        case LlmFailed(will_retry=False):
            turn = _turn(state, event.turn)
            model = (turn.request.model if turn else "") or "unknown"
            start = turn.request.time if turn is not None else event.time
            attrs: dict[str, Attr] = {
                sc.OPERATION: "chat",
                sc.REQUEST_MODEL: model,
                sc.ERROR_TYPE: event.kind,
                sc.TURN: event.turn,
            }
            return [span(f"chat {model}", start, event.time, attrs, "client", event.message)]
        case ToolCompleted():
            call = state.call(event.call_id)
            started = call.started.time if call is not None and call.started is not None else None
            start = started or event.time - timedelta(milliseconds=event.duration_ms)
            attrs = {
                sc.OPERATION: "execute_tool",
                sc.TOOL_NAME: event.tool,
                sc.TOOL_CALL_ID: event.call_id,
                sc.TOOL_TYPE: "function",
            }
            error: str | None = None
            if event.is_error:
                kind = event.error_kind or "tool_error"
                attrs[sc.ERROR_TYPE] = kind
                error = _text(event.content)[:300] or kind
            if content:
                if call is not None:
                    attrs[sc.TOOL_ARGUMENTS] = _json(call.arguments)
                attrs[sc.TOOL_RESULT] = _text(event.content)[:CONTENT_CHARS]
            return [span(f"execute_tool {event.tool}", start, event.time, attrs, error=error)]
        case GrantIssued() | GrantDenied():
            call = state.call(event.call_id)
            requested = call.requested if call is not None else None
            start = requested.time if requested is not None else event.time
            decision = "granted" if isinstance(event, GrantIssued) else "denied"
            attrs = {
                sc.TOOL_NAME: event.tool,
                sc.TOOL_CALL_ID: event.call_id,
                sc.POLICY_DECISION: decision,
                sc.POLICY_TIER: event.tier,
            }
            if event.rule:
                attrs[sc.POLICY_RULE] = event.rule
            if event.approval_id:
                attrs[sc.APPROVAL_ID] = event.approval_id
            return [span(f"policy {event.tool}", start, event.time, attrs)]
        case ApprovalGranted() | ApprovalDenied() | ApprovalExpired():
            request = state.approvals.get(event.approval_id)
            answers = state.answers.get(event.approval_id, [])
            if request is None or not answers or answers[0].id != event.id:
                return []  # only the first answer closes the wait
            result = {ApprovalGranted: "granted", ApprovalDenied: "denied"}.get(
                type(event), "expired"
            )
            waited = (event.time - request.time).total_seconds()
            about: dict[str, str] = (
                {sc.BUDGET_EXCEEDED_ID: request.call_id}  # a run over budget asking for more
                if request.about == "budget"
                else {sc.TOOL_NAME: request.tool, sc.TOOL_CALL_ID: request.call_id}
            )
            attrs = {
                **about,
                sc.APPROVAL_ID: event.approval_id,
                sc.APPROVAL_RESULT: result,
                sc.APPROVAL_WAIT_S: round(waited, 6),
                sc.POLICY_TIER: request.tier,
            }
            if isinstance(event, ApprovalGranted | ApprovalDenied):
                attrs[sc.APPROVER] = event.approver
            return [span(f"approval {request.tool}", request.time, event.time, attrs)]
        case GuardrailChecked():
            start = event.time - timedelta(milliseconds=event.duration_ms)
            attrs = {
                sc.GUARDRAIL_CHECKPOINT: event.checkpoint,
                sc.GUARDRAIL_ACTION: event.action,
                sc.GUARDRAIL_FIRED: list(event.fired),
            }
            if event.tool:
                attrs[sc.TOOL_NAME] = event.tool
            if event.error:
                attrs[sc.ERROR_TYPE] = "detector_error"
            return [
                span(f"guardrail {event.checkpoint}", start, event.time, attrs, error=event.error)
            ]
        case BudgetExceeded():
            attrs = {
                sc.BUDGET_SCOPE: event.scope,
                sc.BUDGET_KEY: event.key,
                sc.BUDGET_LIMIT: event.limit,
                sc.BUDGET_ON_EXCEED: event.on_exceed,
                sc.COST_USD: event.spent_usd,
                sc.TURN: event.turn,
            }
            return [span(f"budget {event.scope}", event.time, event.time, attrs)]
        case RunCompleted() | RunFailed() | RunCancelled():
            if state.outcome is None or state.outcome.id != event.id:
                return []
            return [_invoke_agent(event, state, trace_id, common)]
    return []


def _chat(event: LlmResponded, turn: TurnState | None, span, content: bool) -> SpanRecord:  # type: ignore[no-untyped-def]
    u = event.usage
    requested = (turn.request.model if turn is not None else "") or event.model
    attrs: dict[str, Attr] = {
        sc.OPERATION: "chat",
        sc.PROVIDER: event.provider,
        sc.REQUEST_MODEL: requested,
        sc.RESPONSE_MODEL: event.model,
        sc.RESPONSE_ID: event.id,
        sc.FINISH_REASONS: [event.stop_reason],
        # all input tokens, cached ones included; the cache parts on their own as well
        sc.INPUT_TOKENS: u.input_tokens + u.cache_read_tokens + u.cache_write_tokens,
        sc.OUTPUT_TOKENS: u.output_tokens,
        sc.CACHE_READ_TOKENS: u.cache_read_tokens,
        sc.CACHE_WRITE_TOKENS: u.cache_write_tokens,
        sc.COST_USD: event.cost_usd,
        sc.TURN: event.turn,
    }
    if content:
        attrs[sc.OUTPUT_MESSAGES] = _json(
            [
                {
                    "role": "assistant",
                    "parts": msgspec.to_builtins(event.content),
                    "finish_reason": event.stop_reason,
                }
            ]
        )[:CONTENT_CHARS]
    start = event.time - timedelta(milliseconds=event.latency_ms)
    if turn is not None and event.latency_ms <= 0:
        start = turn.request.time
    record: SpanRecord = span(f"chat {event.model}", start, event.time, attrs, "client")
    return record


def _invoke_agent(
    event: RunCompleted | RunFailed | RunCancelled,
    state: RunState,
    trace_id: int,
    common: dict[str, Attr],
) -> SpanRecord:
    assert state.task is not None
    _, parent = run_context(state)
    agent = state.started.agent if state.started is not None else state.task.agent
    responses = [t.response for t in state.turns if t.response is not None]
    attrs: dict[str, Attr] = {
        **common,
        sc.OPERATION: "invoke_agent",
        sc.AGENT_NAME: agent,
        sc.AGENT_ID: state.run_id,
        sc.STEPS: len(state.turns),
        sc.INPUT_TOKENS: sum(
            r.usage.input_tokens + r.usage.cache_read_tokens + r.usage.cache_write_tokens
            for r in responses
        ),
        sc.OUTPUT_TOKENS: sum(r.usage.output_tokens for r in responses),
        sc.COST_USD: round(sum(r.cost_usd for r in responses), 9),
    }
    if responses:
        attrs[sc.PROVIDER] = responses[-1].provider
        attrs[sc.REQUEST_MODEL] = responses[-1].model
    if state.task.parent_run_id:
        attrs[sc.PARENT_RUN] = state.task.parent_run_id
    error = None
    match event:
        case RunCompleted():
            attrs[sc.OUTCOME] = "completed"
        case RunFailed(kind=kind, reason=reason):
            attrs[sc.OUTCOME], attrs[sc.ERROR_TYPE], error = "failed", kind, reason
        case RunCancelled(reason=reason):
            attrs[sc.OUTCOME], attrs[sc.ERROR_TYPE], error = "cancelled", "cancelled", reason
    start = state.started.time if state.started is not None else state.task.time
    return SpanRecord(
        name=f"invoke_agent {agent}",
        trace_id=trace_id,
        span_id=agent_span_id(state.run_id),
        parent_id=parent,
        start_ns=ns(min(start, event.time)),
        end_ns=ns(event.time),
        attributes=attrs,
        error=error,
    )


def _turn(state: RunState, index: int) -> TurnState | None:
    return next((t for t in reversed(state.turns) if t.index == index), None)


def _text(blocks: object) -> str:
    if not isinstance(blocks, list):
        return ""
    return "\n".join(b.text for b in blocks if isinstance(b, TextBlock))


def _json(value: object) -> str:
    return msgspec.json.encode(value).decode()[:CONTENT_CHARS]
