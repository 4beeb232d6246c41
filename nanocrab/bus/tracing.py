"""W3C trace context on the bus and OpenTelemetry set-up.

Every appended event carries a ``traceparent`` (in its envelope and as a NATS header). When no
span is active one is minted, so even an event published by a plain script starts a trace that
the handlers' spans then continue hop by hop.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Literal

import msgspec
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util import ns_to_iso_str
from opentelemetry.trace import SpanContext
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


class JsonLinesExporter(SpanExporter):
    """Writes finished spans to ``out`` as one compact JSON object per line (JSON Lines:
    ``traces.jsonl``), in the SDK's ``ReadableSpan.to_json`` shape, one write per batch.

    The SDK's own console exporter builds each line with the standard ``json`` module and
    re-encodes the resource for every span, on the batch processor's thread but holding the
    GIL the event loop needs; here msgspec encodes a span in a few microseconds and the
    resource once per resource."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self._resources: dict[int, tuple[Resource, msgspec.Raw]] = {}

    def _resource(self, resource: Resource) -> msgspec.Raw:
        cached = self._resources.get(id(resource))
        if cached is None or cached[0] is not resource:
            raw = msgspec.Raw(
                _encoder.encode(
                    {"attributes": dict(resource.attributes), "schema_url": resource.schema_url}
                )
            )
            cached = self._resources[id(resource)] = (resource, raw)
        return cached[1]

    def line(self, span: ReadableSpan) -> bytes:
        ctx = span.context
        status: dict[str, str] = {"status_code": span.status.status_code.name}
        if span.status.description:
            status["description"] = span.status.description
        return _encoder.encode(
            {
                "name": span.name,
                "context": _context(ctx) if ctx is not None else None,
                "kind": str(span.kind),
                "parent_id": f"0x{span.parent.span_id:016x}" if span.parent else None,
                "start_time": _iso(span.start_time),
                "end_time": _iso(span.end_time),
                "status": status,
                "attributes": dict(span.attributes) if span.attributes is not None else None,
                "events": [
                    {
                        "name": e.name,
                        "timestamp": _iso(e.timestamp),
                        "attributes": dict(e.attributes) if e.attributes is not None else None,
                    }
                    for e in span.events
                ],
                "links": [
                    {
                        "context": _context(link.context),
                        "attributes": dict(link.attributes)
                        if link.attributes is not None
                        else None,
                    }
                    for link in span.links
                ],
                "resource": self._resource(span.resource),
            }
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = b"".join(self.line(span) + b"\n" for span in spans).decode()
        self.out.write(text)
        self.out.flush()
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.out.flush()
        return True


_encoder = msgspec.json.Encoder()


def _context(ctx: SpanContext) -> dict[str, str]:
    return {
        "trace_id": f"0x{ctx.trace_id:032x}",
        "span_id": f"0x{ctx.span_id:016x}",
        "trace_state": repr(ctx.trace_state),
    }


def _iso(ns: int | None) -> str | None:
    return ns_to_iso_str(ns) if ns else None


def json_lines_exporter(out: IO[str] | None = None) -> SpanExporter:
    """Writes each finished span to ``out`` (stdout by default) as one compact JSON object per
    line (JSON Lines: ``traces.jsonl``), not the SDK's default pretty-printed multi-line form."""
    return JsonLinesExporter(out)


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
    processor: SpanProcessor
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor = BatchSpanProcessor(OTLPSpanExporter())
    else:
        out = console_out
        if out is None and console_path is not None:
            console_path.parent.mkdir(parents=True, exist_ok=True)
            out = console_path.open("a", encoding="utf-8")
        # small batches: the export thread takes the GIL from the event loop for ~1 ms at a
        # time, not for one long write of 512 spans (which showed in the loop's p99)
        processor = BatchSpanProcessor(
            json_lines_exporter(out), max_export_batch_size=64, schedule_delay_millis=500
        )
    provider.add_span_processor(processor)
    _processors.append(processor)
    trace.set_tracer_provider(provider)
    return provider


_processors: list[SpanProcessor] = []


def span_processors() -> list[SpanProcessor]:
    """The processors :func:`configure_tracing` installed: spans built elsewhere (the GenAI
    spans of ``nanocrab/observe``) are handed to them, so they land beside the handlers'."""
    return list(_processors)
