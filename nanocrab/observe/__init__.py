"""Telemetry from the log: OpenTelemetry GenAI spans and metrics, alerts on budgets, dead letters
and handler lag (docs/observability.md).

The agent loop's handlers stay as they are (one messaging span per handled event, hot path
untouched); the ``telemetry`` handler reads the same events and turns each run into the GenAI
semantic conventions' spans — ``invoke_agent``, ``chat {model}``, ``execute_tool {name}``, plus
policy, approval and guardrail spans — with ids derived from the run, so one run is one trace
whatever process handled which event, and a redelivery re-exports the same span ids."""

from nanocrab.observe.export import Telemetry, configure_telemetry
from nanocrab.observe.handler import TelemetryHandler
from nanocrab.observe.spans import SpanRecord, spans_for

__all__ = ["SpanRecord", "Telemetry", "TelemetryHandler", "configure_telemetry", "spans_for"]
