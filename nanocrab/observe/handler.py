"""The ``telemetry`` handler: a run's events become GenAI spans and metrics; budget stops, dead
letters and handler lag become alerts.

Consumes the run outcomes, ``approval.*``, ``budget.exceeded``, ``capability.invoked`` and the
dead-letter records; when a run ends, its spans (``spans.py``) and metrics come from its folded
state. With ``live`` it also consumes what closes a span on the way (``llm.responded``,
``llm.failed``, ``tool.completed``, ``grant.*``, ``guardrail.checked``) and exports each span
as it ends.
Emits ``alert.raised`` for a ``budget.exceeded``, a dead letter (``bus.dead_lettered`` /
``bus.malformed``) and — from its background poll of every handler's durable consumer — a
handler whose pending events stay above ``lag_threshold`` (re-armed once it is back under half
of it). Alerts also go to the webhook (``handlers/alerts.py``) when one is configured.

It never sits on a run's path: the agent loop's handlers do not wait for it, and its only
costs to them are a consumer on the log and a share of the CPU. Redelivery is harmless: span
ids derive from the run and the closing event (a re-export repeats the same span), alert ids
from their cause (the log keeps one), and the events this process already exported are
remembered (a bounded set) so metrics do not count them twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence

import nats.errors
import nats.js.errors

from nanocrab.bus import Delivery, EventLog
from nanocrab.events import (
    AgentMetric,
    AgentResponded,
    AlertRaised,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    BudgetExceeded,
    BusDeadLettered,
    BusMalformed,
    CapabilityInvoked,
    Event,
    GrantDenied,
    GrantIssued,
    GuardrailChecked,
    LlmFailed,
    LlmResponded,
    RunCancelled,
    RunCompleted,
    RunFailed,
    ToolCompleted,
    ToolResolved,
    derive_event_id,
    utcnow,
)
from nanocrab.handlers.alerts import AlertSink
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.runstate import RunState
from nanocrab.observe import semconv as sc
from nanocrab.observe.export import Telemetry, telemetry
from nanocrab.observe.spans import spans_for

log = logging.getLogger(__name__)

SEEN = 20_000
"""Closing events remembered as exported (a redelivery is not counted twice)."""


PER_EVENT: tuple[type[Event], ...] = (
    LlmResponded, AgentResponded, LlmFailed, ToolCompleted, ToolResolved, GrantIssued,
    GrantDenied, GuardrailChecked, AgentMetric,
)  # fmt: skip
"""What closes a span or moves a metric within a run: consumed one by one only when ``live``;
otherwise read from the run's state when the run ends."""
ALWAYS: tuple[type[Event], ...] = (
    ApprovalRequested, ApprovalGranted, ApprovalDenied, ApprovalExpired, BudgetExceeded,
    RunCompleted, RunFailed, RunCancelled, CapabilityInvoked, BusDeadLettered, BusMalformed,
)  # fmt: skip
"""Consumed as they come: run ends, approvals (a person's wait is live), budget stops (alerts),
sandbox runs and dead letters (alerts)."""
RUN_END = (RunCompleted, RunFailed, RunCancelled)


class TelemetryHandler:
    name = "telemetry"
    consumes: tuple[type[Event], ...] = ALWAYS
    concurrency = 16

    def __init__(
        self,
        log_: EventLog,
        *,
        telemetry_: Telemetry | None = None,
        content: bool = False,
        alerts: AlertSink | None = None,
        handlers: Sequence[str] = (),
        lag_threshold: int = 1000,
        poll_s: float = 5.0,
        live: bool = False,
    ) -> None:
        """``content``: record message content on spans (opt-in). ``handlers``: the durable
        consumers to watch for lag (``nanocrab.handler.pending``) and alert on above
        ``lag_threshold`` pending events, polled every ``poll_s``. ``live``: export each model
        and tool span as it ends (one delivery per closing event, ~9 per one-tool run);
        otherwise a run's spans and metrics are made from its state when it ends (one delivery
        per run: a third of the CPU; measured in docs/observability.md)."""
        self.live = live
        self.consumes = (*PER_EVENT, *ALWAYS) if live else ALWAYS
        self.log = log_
        self.telemetry = telemetry_ or telemetry()
        self.content = content
        self.alerts = alerts
        self.handlers = tuple(handlers)
        self.lag_threshold = lag_threshold
        self.poll_s = poll_s
        self.loader = RunLoader(log_)
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lagging: set[str] = set()

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        m = self.telemetry.instruments
        m.handler_lag.record(
            max(0.0, (utcnow() - event.time).total_seconds()), {sc.HANDLER: self.name}
        )
        if event.id in self._seen:
            return []
        out: list[Event] = []
        match event:
            case BusDeadLettered() | BusMalformed():
                m.dead_letters.add(1, {sc.HANDLER: event.handler, sc.REASON: event.reason_kind})
                out.append(
                    AlertRaised(
                        severity="critical" if event.reason_kind == "poison" else "warning",
                        origin="dead_letter",
                        summary=f"handler {event.handler} gave up on stream seq "
                        f"{event.stream_seq} ({event.reason_kind}): {event.reason[:200]}",
                        labels=[event.handler, event.reason_kind],
                    )
                )
            case CapabilityInvoked():
                m.sandbox.add(1, {sc.SANDBOX_OUTCOME: event.outcome, sc.CAPABILITY: event.name})
            case _ if event.run_id is not None:
                state = await self.loader.state(event.run_id)
                closing = [event]
                if not self.live and isinstance(event, RUN_END):  # the whole run, at its end
                    closing = [e for e in state.events if isinstance(e, PER_EVENT)] + closing
                for e in closing:
                    for record in spans_for(e, state, content=self.content):
                        self.telemetry.export(record)
                    out += self._record(e, state)
                if state.terminal:
                    self.loader.forget(event.run_id)
        self._remember(event.id)
        if self.alerts is not None:
            for alert in out:
                if isinstance(alert, AlertRaised):
                    self.alerts.send(alert, run_id=event.run_id)
        return out

    def _record(self, event: Event, state: RunState) -> list[Event]:
        """The metrics ``event`` moves; the alert it raises, if any."""
        m = self.telemetry.instruments
        agent = state.started.agent if state.started is not None else "default"
        match event:
            case LlmResponded(usage=u):
                base = {
                    sc.OPERATION: "chat",
                    sc.PROVIDER: event.provider,
                    sc.REQUEST_MODEL: event.model,
                    sc.RESPONSE_MODEL: event.model,
                }
                inputs = u.input_tokens + u.cache_read_tokens + u.cache_write_tokens
                m.token_usage.record(inputs, {**base, sc.TOKEN_TYPE: "input"})
                m.token_usage.record(u.output_tokens, {**base, sc.TOKEN_TYPE: "output"})
                m.operation_duration.record(event.latency_ms / 1000, base)
                if event.cost_usd:
                    m.cost.add(
                        event.cost_usd,
                        {
                            sc.REQUEST_MODEL: event.model,
                            sc.AGENT_NAME: agent,
                            sc.TENANT: event.tenant,
                        },
                    )
            case LlmFailed(will_retry=False):
                turn = next((t for t in state.turns if t.index == event.turn), None)
                if turn is not None:
                    model = turn.request.model or "unknown"
                    m.operation_duration.record(
                        (event.time - turn.request.time).total_seconds(),
                        {sc.OPERATION: "chat", sc.REQUEST_MODEL: model, sc.ERROR_TYPE: event.kind},
                    )
            case AgentMetric():  # a Python agent's own measurement (docs/agents.md)
                labels = {f"{sc.AGENT_METRIC_LABEL}{k}": v for k, v in event.labels.items()}
                m.agent_metric.record(event.value, {
                    **labels, sc.AGENT_NAME: event.agent, sc.AGENT_METRIC_NAME: event.name,
                    sc.AGENT_METRIC_UNIT: event.unit,
                })  # fmt: skip
            case ToolCompleted():
                outcome = (event.error_kind or "error") if event.is_error else "ok"
                m.tool_duration.record(
                    event.duration_ms / 1000, {sc.TOOL_NAME: event.tool, sc.OUTCOME: outcome}
                )
            case ApprovalRequested():
                m.approvals_waiting.add(1, {sc.POLICY_TIER: event.tier})
            case ApprovalGranted() | ApprovalDenied() | ApprovalExpired():
                request = state.approvals.get(event.approval_id)
                answers = state.answers.get(event.approval_id, [])
                if request is not None and answers and answers[0].id == event.id:
                    m.approvals_waiting.add(-1, {sc.POLICY_TIER: request.tier})
                    result = event.type.rsplit(".", 1)[1]
                    m.approval_wait.record(
                        (event.time - request.time).total_seconds(), {sc.APPROVAL_RESULT: result}
                    )
            case GuardrailChecked():
                m.guardrail.add(
                    1,
                    {sc.GUARDRAIL_CHECKPOINT: event.checkpoint, sc.GUARDRAIL_ACTION: event.action},
                )
            case BudgetExceeded():
                m.budget_exceeded.add(
                    1, {sc.BUDGET_SCOPE: event.scope, sc.BUDGET_LIMIT: event.limit}
                )
                cap = f"${event.max_usd}" if event.limit == "usd" else f"{event.max_tokens} tokens"
                spent = (
                    f"${event.spent_usd:.4f}"
                    if event.limit == "usd"
                    else f"{event.spent_tokens} tokens"
                )
                what = "waits for an approval" if event.on_exceed == "ask" else "stopped"
                return [
                    AlertRaised(
                        severity="warning",
                        origin="budget",
                        summary=f"run {state.run_id} {what}: the {event.scope} budget of "
                        f"{event.key} is spent ({spent} of {cap})",
                        labels=[event.scope, event.limit],
                    )
                ]
            case RunCompleted() | RunFailed() | RunCancelled():
                if state.outcome is not None and state.outcome.id == event.id:
                    ended = "completed" if isinstance(event, RunCompleted) else "cancelled"
                    if isinstance(event, RunFailed):
                        ended = f"failed:{event.kind}"
                    m.runs.add(1, {sc.OUTCOME: ended, sc.AGENT_NAME: agent})
        return []

    def _remember(self, event_id: str) -> None:
        self._seen[event_id] = None
        if len(self._seen) > SEEN:
            self._seen.popitem(last=False)

    async def background(self) -> None:
        """Poll each watched handler's durable consumer: pending and redelivered counts for the
        gauges, and an alert when one stays behind by more than ``lag_threshold`` events."""
        if self.alerts is None:
            await self._poll_forever()
            return
        # the webhook's own loop, for as long as this one runs
        sending = asyncio.create_task(self.alerts.run(), name="telemetry alerts")
        try:
            await self._poll_forever()
        finally:
            sending.cancel()

    async def _poll_forever(self) -> None:
        while True:
            for durable in self.handlers:
                with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
                    await self.poll(durable)
            await asyncio.sleep(self.poll_s)

    async def poll(self, durable: str) -> AlertRaised | None:
        """One look at ``durable``'s consumer; the lag alert it raised (appended), if any."""
        info = await self.log.js.consumer_info(self.log.cfg.log_stream, durable)
        m = self.telemetry.instruments
        pending = int(info.num_pending or 0)
        m.pending[durable] = pending
        m.redelivered[durable] = int(info.num_redelivered or 0)
        if pending < self.lag_threshold // 2:
            self._lagging.discard(durable)
        if pending <= self.lag_threshold or durable in self._lagging:
            return None
        self._lagging.add(durable)
        now = utcnow()
        alert = AlertRaised(
            id=derive_event_id(self.name, f"lag:{durable}:{now.isoformat()}", 0),
            source=self.name,
            severity="warning",
            origin="handler_lag",
            summary=f"handler {durable} is {pending} events behind the log "
            f"(threshold {self.lag_threshold})",
            labels=[durable],
            score=float(pending),
        )
        await self.log.append(alert)
        if self.alerts is not None:
            self.alerts.send(alert)
        return alert
