"""Where spans and metrics go: the process's :class:`Telemetry`.

Derived spans (``spans.py``) go through the same span processors as the handlers' own spans
(``bus/tracing.py``: the JSON Lines file, or OTLP), so one run's trace is in one place. Metrics
go to OTLP (``NANOCRAB_TRACES=otlp``: the standard ``OTEL_EXPORTER_OTLP_*`` variables) and/or a
Prometheus endpoint (``nanocrab up --metrics-port``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from nanocrab.bus import tracing
from nanocrab.observe.metrics import Instruments
from nanocrab.observe.spans import SpanRecord

SCOPE = InstrumentationScope("nanocrab.observe", "1")
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}


class Telemetry:
    """Span processors for derived spans and a meter provider with its instruments.

    ``processors``: where spans go (default: those :func:`~nanocrab.bus.tracing.configure_tracing`
    installed). ``readers``: metric readers (OTLP, Prometheus, or an in-memory one in tests).
    """

    def __init__(
        self,
        service_name: str = "nanocrab",
        *,
        processors: Sequence[SpanProcessor] | None = None,
        readers: Sequence[MetricReader] = (),
    ) -> None:
        self.resource = Resource.create({"service.name": service_name})
        self.processors = list(tracing.span_processors() if processors is None else processors)
        self.meter_provider = MeterProvider(resource=self.resource, metric_readers=list(readers))
        self.instruments = Instruments(self.meter_provider.get_meter("nanocrab.observe", "1"))
        self.exported = 0

    def export(self, record: SpanRecord) -> None:
        """Hand one finished span to every processor (a batch processor only queues it)."""
        if not self.processors:
            return
        context = SpanContext(
            record.trace_id,
            record.span_id,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        parent = None
        if record.parent_id is not None:
            parent = SpanContext(
                record.trace_id,
                record.parent_id,
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
        status = Status(StatusCode.ERROR, record.error) if record.error else Status(StatusCode.OK)
        span = ReadableSpan(
            name=record.name,
            context=context,
            parent=parent,
            resource=self.resource,
            attributes=record.attributes,
            kind=_KINDS[record.kind],
            status=status,
            start_time=record.start_ns,
            end_time=record.end_ns,
            instrumentation_scope=SCOPE,
        )
        for p in self.processors:
            p.on_end(span)
        self.exported += 1

    def flush(self, timeout_ms: int = 10_000) -> None:
        """Export what is queued now (spans and metrics)."""
        for p in self.processors:
            p.force_flush(timeout_ms)
        self.meter_provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        self.meter_provider.shutdown()


_current: Telemetry | None = None
_lock = threading.Lock()


def configure_telemetry(
    service_name: str,
    *,
    otlp_metrics: bool = False,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    export_interval_ms: int = 10_000,
) -> Telemetry:
    """Install the process's telemetry: spans through the installed trace processors, metrics
    to OTLP (``otlp_metrics``) and/or a Prometheus endpoint on ``metrics_host:metrics_port``
    (``/metrics``). Returns it; :func:`telemetry` returns it from then on."""
    global _current
    readers: list[MetricReader] = []
    if otlp_metrics:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(
            PeriodicExportingMetricReader(
                OTLPMetricExporter(), export_interval_millis=export_interval_ms
            )
        )
    if metrics_port is not None:
        readers.append(prometheus_reader(metrics_port, metrics_host))
    with _lock:
        _current = Telemetry(service_name, readers=readers)
        return _current


def prometheus_reader(port: int, host: str = "127.0.0.1", registry: object = None) -> MetricReader:
    """A Prometheus reader served at ``http://host:port/metrics`` (``registry``: a
    ``prometheus_client.CollectorRegistry`` of its own, for tests; default the global one)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    reg = registry if isinstance(registry, CollectorRegistry) else REGISTRY
    reader = PrometheusMetricReader(registry=reg)
    start_http_server(port, addr=host, registry=reg)
    return reader


def configured() -> bool:
    """Whether :func:`configure_telemetry` ran in this process."""
    return _current is not None


def telemetry() -> Telemetry:
    """The process's telemetry: the configured one, else one that exports spans through the
    installed trace processors and keeps metrics in memory only."""
    global _current
    with _lock:
        if _current is None:
            _current = Telemetry(_service_name())
        return _current


def _service_name() -> str:
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        return str(provider.resource.attributes.get("service.name") or "nanocrab")
    return "nanocrab"
