"""A real OTLP/HTTP receiver on loopback for the telemetry tests: it accepts the protobuf
``POST /v1/traces`` and ``/v1/metrics`` requests the SDK's exporters send, decodes them with
opentelemetry-proto and keeps every span and metric data point it received."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    service: str


@dataclass
class Point:
    metric: str
    unit: str
    attributes: dict[str, Any]
    value: float  # a sum's or gauge's value, a histogram's sum
    count: int = 0  # a histogram's count


@dataclass
class Receiver:
    spans: list[Span] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    receiver.traces(ExportTraceServiceRequest.FromString(body))
                    reply = ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    receiver.metrics(ExportMetricsServiceRequest.FromString(body))
                    reply = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def traces(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            self.requests += 1
            for rs in request.resource_spans:
                service = {a.key: value(a.value) for a in rs.resource.attributes}.get(
                    "service.name", ""
                )
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(
                            Span(
                                name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                                parent_id=s.parent_span_id.hex(), kind=s.kind,
                                start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                                attributes={a.key: value(a.value) for a in s.attributes},
                                status_code=s.status.code, status_message=s.status.message,
                                service=service,
                            )
                        )  # fmt: skip

    def metrics(self, request: ExportMetricsServiceRequest) -> None:
        with self.lock:
            self.requests += 1
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        data = getattr(m, kind)
                        for p in data.data_points:
                            attrs = {a.key: value(a.value) for a in p.attributes}
                            if kind == "histogram":
                                point = Point(m.name, m.unit, attrs, p.sum, p.count)
                            else:
                                v = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                                point = Point(m.name, m.unit, attrs, float(v))
                            self.points.append(point)

    def named(self, prefix: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.name.startswith(prefix)]

    def metric(self, name: str) -> list[Point]:
        with self.lock:
            return [p for p in self.points if p.metric == name]
