"""W3C trace context on the bus and OpenTelemetry set-up.

Every appended event carries a ``traceparent`` (in its envelope and as a NATS header). When no
span is active one is minted, so even an event published by a plain script starts a trace that
the handlers' spans then continue hop by hop.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util import ns_to_iso_str
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status, StatusCode
from opentelemetry.util.types import AttributeValue

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
    resource once per resource. The resource's ``telemetry.sdk.*`` attributes (which SDK wrote
    the span: the same on every line) are left out of the file — a quarter of the resource, a
    tenth of a line; OTLP export keeps them."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self._resources: dict[int, tuple[Resource, msgspec.Raw]] = {}

    def _resource(self, resource: Resource) -> msgspec.Raw:
        cached = self._resources.get(id(resource))
        if cached is None or cached[0] is not resource:
            raw = msgspec.Raw(
                _encoder.encode(
                    {
                        "attributes": {
                            k: v
                            for k, v in resource.attributes.items()
                            if not k.startswith("telemetry.sdk.")
                        },
                        "schema_url": resource.schema_url,
                    }
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
    standard ``OTEL_EXPORTER_OTLP_*`` environment variables and exports from a child process
    (``span_export.py``; ``NANOCRAB_OTLP_EXPORT=thread``: the SDK's batch thread in this
    process instead); ``none`` leaves tracing off.
    """
    if exporter == "none":
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    processor: SpanProcessor
    if exporter == "otlp" and os.environ.get("NANOCRAB_OTLP_EXPORT", "process") == "thread":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor = BatchSpanProcessor(OTLPSpanExporter())
    elif exporter == "otlp":  # encoded and sent by a child process: off this one's GIL
        from nanocrab.bus.span_export import ChildSpanProcessor

        processor = ChildSpanProcessor()
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
    global _handler_spans
    quiet_ms = float(os.environ.get("NANOCRAB_TRACE_QUIET_MS", "1"))
    _handler_spans = HandlerSpans(
        provider.resource, _processors, quiet_below_ns=int(quiet_ms * 1_000_000)
    )
    return provider


_processors: list[SpanProcessor] = []
_handler_spans: HandlerSpans | None = None


def handler_spans() -> HandlerSpans | None:
    """The handlers' span maker :func:`configure_tracing` installed (``None``: tracing off)."""
    return _handler_spans


_SCOPE = InstrumentationScope("nanocrab.bus")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class HandledSpan:
    """The span of one handled event while it is open: what ``handle()`` going wrong sets."""

    __slots__ = ("context", "exception", "quiet", "status")

    def __init__(self, context: SpanContext) -> None:
        self.context = context
        self.status = Status(StatusCode.UNSET)
        self.exception: BaseException | None = None
        self.quiet = False
        """Set by the runtime when the delivery appended nothing: see :class:`HandlerSpans`."""

    def set_status(self, status: Status, description: str | None = None) -> None:
        self.status = status

    def record_exception(self, exception: BaseException) -> None:
        self.exception = exception


class HandlerSpans:
    """The handlers' span per handled event (``bus/runtime.py``), made cheaply on the event loop.

    Through the SDK a span costs ~37 µs per handled event where the no-op tracer costs ~11 µs
    (sampler, id generator, attribute validation against abstract base classes, locks); a
    one-tool run handles ~29 events in the process that runs the agent loop, so that was most of
    the tracing's cost on a run's path (docs/observability.md, "Overhead"). Here the open span is
    a :class:`~opentelemetry.trace.NonRecordingSpan` with fresh ids, made current so the events
    appended inside carry its ``traceparent``; when it closes, the finished span is built
    directly as a ``ReadableSpan`` and handed to the same processors (the OTLP or JSON Lines
    batch). Same name, kind (CONSUMER), parent, ids, attributes, status and exception event as
    the SDK would export. Sampling follows the parent's ``sampled`` flag (an event's
    ``traceparent`` always has one: the root decision was the SDK's, where the trace began).

    A *quiet* delivery — one that appended nothing and did not fail, such as a handler dropping
    a finished run from its cache — is not exported when it took less than ``quiet_below_ns``:
    a third of a one-tool run's spans were such sub-millisecond no-ops, which made the trace
    file larger than the event log (docs/observability.md, "The handlers' messaging spans"). A quiet
    delivery that took longer is kept: time spent is what a trace is read for.
    ``NANOCRAB_TRACE_QUIET_MS`` sets the bound (default 1; 0 exports every delivery)."""

    def __init__(
        self,
        resource: Resource,
        processors: Sequence[SpanProcessor],
        *,
        quiet_below_ns: int = 1_000_000,
    ) -> None:
        self.resource = resource
        self.processors = processors
        self.quiet_below_ns = quiet_below_ns

    @contextlib.contextmanager
    def span(
        self, name: str, traceparent: str | None, attributes: Mapping[str, AttributeValue]
    ) -> Iterator[HandledSpan]:
        parent = _parent(traceparent)
        flags = parent.trace_flags if parent is not None else _SAMPLED
        trace_id = parent.trace_id if parent is not None else random.getrandbits(128)
        ctx = SpanContext(trace_id, random.getrandbits(64), is_remote=False, trace_flags=flags)
        opened = HandledSpan(ctx)
        start = time.time_ns()
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(ctx)))
        try:
            yield opened
        finally:
            otel_context.detach(token)
            end = time.time_ns()
            if (
                flags.sampled
                and self.processors
                and not (opened.quiet and end - start < self.quiet_below_ns)
            ):
                self._finish(name, opened, parent, attributes, start, end)

    def _finish(
        self,
        name: str,
        opened: HandledSpan,
        parent: SpanContext | None,
        attributes: Mapping[str, AttributeValue],
        start: int,
        end: int,
    ) -> None:
        events: list[SpanEvent] = []
        if (exc := opened.exception) is not None:
            stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            events.append(SpanEvent("exception", {
                "exception.type": type(exc).__qualname__, "exception.message": str(exc),
                "exception.stacktrace": stack, "exception.escaped": "False",
            }, end))  # fmt: skip
        span = ReadableSpan(
            name=name,
            context=opened.context,
            parent=parent,
            resource=self.resource,
            attributes=dict(attributes),
            events=events,
            kind=SpanKind.CONSUMER,
            status=opened.status,
            start_time=start,
            end_time=end,
            instrumentation_scope=_SCOPE,
        )
        for p in self.processors:
            p.on_end(span)


def _parent(traceparent: str | None) -> SpanContext | None:
    """The remote parent a ``traceparent`` names (``00-<trace>-<span>-<flags>``), or ``None``."""
    if not traceparent or len(traceparent) != 55 or not traceparent.startswith("00-"):
        return None
    try:
        trace_id, span_id = int(traceparent[3:35], 16), int(traceparent[36:52], 16)
        flags = TraceFlags(int(traceparent[53:55], 16))
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)


def span_processors() -> list[SpanProcessor]:
    """The processors :func:`configure_tracing` installed: spans built elsewhere (the GenAI
    spans of ``nanocrab/observe``) are handed to them, so they land beside the handlers'."""
    return list(_processors)
