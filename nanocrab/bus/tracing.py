"""W3C trace context on the bus and OpenTelemetry set-up.

Every appended event carries a ``traceparent`` (in its envelope and as a NATS header). When no
span is active one is minted, so even an event published by a plain script starts a trace that
the handlers' spans then continue hop by hop.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import IO, Literal

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()

TraceExporter = Literal["console", "otlp", "none"]


def current_traceparent() -> str | None:
    """The active span's ``traceparent`` header value, or ``None`` when no span is recording."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def new_traceparent() -> str:
    """A fresh sampled root ``traceparent`` for events published outside any span."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def context_from(traceparent: str | None) -> Context | None:
    """The OpenTelemetry context to parent a span on, from a ``traceparent`` value."""
    if not traceparent:
        return None
    return _propagator.extract({"traceparent": traceparent})


def _json_line(span: ReadableSpan) -> str:
    line: str = span.to_json(indent=None)  # the SDK leaves it untyped
    return line + "\n"


def json_lines_exporter(out: IO[str] | None = None) -> ConsoleSpanExporter:
    """Writes each finished span to ``out`` (stdout by default) as one compact JSON object per
    line (JSON Lines: ``traces.jsonl``), not the SDK's default pretty-printed multi-line form."""
    if out is None:
        return ConsoleSpanExporter(formatter=_json_line)
    return ConsoleSpanExporter(out=out, formatter=_json_line)


def configure_tracing(
    service_name: str,
    *,
    exporter: TraceExporter = "console",
    console_out: IO[str] | None = None,
    console_path: Path | None = None,
) -> TracerProvider | None:
    """Install the global tracer provider.

    ``console`` writes spans as JSON Lines to ``console_out`` or ``console_path`` (the CLI points
    it at a file in the data directory so spans do not drown the terminal); ``otlp`` uses the
    standard ``OTEL_EXPORTER_OTLP_*`` environment variables; ``none`` leaves tracing off.
    """
    if exporter == "none":
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        out = console_out
        if out is None and console_path is not None:
            console_path.parent.mkdir(parents=True, exist_ok=True)
            out = console_path.open("a", encoding="utf-8")
        provider.add_span_processor(BatchSpanProcessor(json_lines_exporter(out)))
    trace.set_tracer_provider(provider)
    return provider
