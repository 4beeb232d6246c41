"""The metric instruments (OpenTelemetry SDK), recorded by the telemetry handler from events.

Names follow the GenAI semantic conventions where one exists (``gen_ai.client.token.usage``,
``gen_ai.client.operation.duration``); the rest are ``nanocrab.*``. Every instrument, its unit
and its attributes are listed in docs/observability.md; the Prometheus names are the SDK's
translation (dots to underscores, the unit and ``_total`` appended).
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from nanocrab.observe import semconv as sc

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
"""The semantic conventions' advised boundaries for token counts."""
SECONDS_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
"""The semantic conventions' advised boundaries for operation durations."""
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)


class Instruments:
    """Every instrument, created once per meter. ``pending`` / ``redelivered``: the latest
    consumer figures per durable (the handler's poll), read by observable gauges."""

    def __init__(self, meter: Meter) -> None:
        self.token_usage = meter.create_histogram(
            sc.M_TOKEN_USAGE,
            unit="{token}",
            description="Tokens used per model call.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.operation_duration = meter.create_histogram(
            sc.M_OPERATION_DURATION,
            unit="s",
            description="Duration of a model call.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.tool_duration = meter.create_histogram(
            sc.M_TOOL_DURATION,
            unit="s",
            description="Duration of a tool execution.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.runs = meter.create_counter(sc.M_RUNS, unit="{run}", description="Runs ended.")
        self.cost = meter.create_counter(
            sc.M_RUN_COST, unit="{USD}", description="What model calls cost (pricing table)."
        )
        self.approvals_waiting = meter.create_up_down_counter(
            sc.M_APPROVALS_WAITING, unit="{approval}", description="Approvals not answered yet."
        )
        self.approval_wait = meter.create_histogram(
            sc.M_APPROVAL_WAIT,
            unit="s",
            description="Time from request to answer.",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self.budget_exceeded = meter.create_counter(
            sc.M_BUDGET_EXCEEDED, unit="{run}", description="Runs stopped by a spending cap."
        )
        self.dead_letters = meter.create_counter(
            sc.M_DEAD_LETTERS, unit="{message}", description="Messages a handler gave up on."
        )
        self.sandbox = meter.create_counter(
            sc.M_SANDBOX, unit="{run}", description="Capability runs in the sandbox, by outcome."
        )
        self.guardrail = meter.create_counter(
            sc.M_GUARDRAIL, unit="{check}", description="Guardrail verdicts, by action."
        )
        self.agent_metric = meter.create_histogram(
            sc.M_AGENT_METRIC,
            description="Measurements Python agents emit (context.emit_metric), by agent and "
            "metric name; the unit is an attribute.",
        )
        self.handler_lag = meter.create_histogram(
            sc.M_HANDLER_LAG,
            unit="s",
            description="Age of an event when the telemetry handler reads it (log to consumer).",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self.pending: dict[str, int] = {}
        self.redelivered: dict[str, int] = {}
        meter.create_observable_gauge(
            sc.M_HANDLER_PENDING,
            [self._observe_pending],
            unit="{message}",
            description="Events on the log a handler's durable consumer has not received yet.",
        )
        meter.create_observable_gauge(
            sc.M_HANDLER_REDELIVERED,
            [self._observe_redelivered],
            unit="{message}",
            description="Messages redelivered to a handler and not yet acknowledged.",
        )

    def _observe_pending(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {sc.HANDLER: h}) for h, n in sorted(self.pending.items())]

    def _observe_redelivered(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {sc.HANDLER: h}) for h, n in sorted(self.redelivered.items())]
