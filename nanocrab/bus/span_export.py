"""OTLP span export in a child process, so exporting costs the event loop's process little.

In process, the SDK's ``BatchSpanProcessor`` exports on a thread of its own, but that thread
needs the GIL for most of its work: turning each span into protobuf objects attribute by
attribute, then the HTTP request. Every batch it exports is time the event loop waits for,
which showed in a one-tool run's latency with export on (``bench/otel_overhead.py``: a p99
twenty milliseconds longer when a batch of ~500 spans went out during a run).

Here :meth:`ChildSpanProcessor.on_end` only appends the finished span to a list. A thread
turns each batch into one compact msgpack frame (msgspec: microseconds per span) and writes it
to a pipe; a child process (``python -m nanocrab.bus.span_export``) rebuilds the spans and
exports them with the SDK's own OTLP/HTTP exporter, configured as usual by the standard
``OTEL_EXPORTER_OTLP_*`` variables (inherited). What reaches the collector is what the
in-process exporter would have sent: same names, ids, parents, kinds, times, status,
attributes, events, links, resources and instrumentation scopes.

The pipe protocol (one frame: a 4-byte big-endian length, then a msgpack array):
``["spans", resources, spans]`` to export; ``["flush", n]``, which the child answers with the
line ``flushed n`` once everything before it is exported; ``["stop"]``. A child that dies is
started again for the next batch (at most once every :data:`RESTART_S` seconds); spans that
could not be handed over are counted in :attr:`ChildSpanProcessor.dropped` and logged.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

import msgspec
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

log = logging.getLogger(__name__)

RESTART_S = 10.0
"""Shortest time between two starts of the child (a child that cannot start is not retried in
a tight loop)."""

_HEADER = struct.Struct(">I")
_encoder = msgspec.msgpack.Encoder()


def _attrs(attributes: Any) -> dict[str, Any]:
    return dict(attributes) if attributes else {}


class ChildSpanProcessor(SpanProcessor):
    """Hands finished spans to a child process that exports them over OTLP/HTTP.

    ``delay_s``: the longest a span waits in this process before it is handed over;
    ``batch``: spans per frame (more wake the hand-over thread at once); ``max_queue``: spans
    held while the child is slow or gone, beyond which new ones are dropped (counted).
    ``command``: the child's command line (tests; default this interpreter running this
    module)."""

    def __init__(
        self,
        *,
        delay_s: float = 0.5,
        batch: int = 512,
        max_queue: int = 8192,
        command: Sequence[str] | None = None,
    ) -> None:
        self.delay_s = delay_s
        self.batch = batch
        self.max_queue = max_queue
        self.command = list(command or [sys.executable, "-m", "nanocrab.bus.span_export"])
        self.dropped = 0
        self.handed_over = 0
        self._spans: list[ReadableSpan] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._flushes: list[threading.Event] = []
        self._stopping = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = -RESTART_S
        self._flush_count = 0
        self._thread = threading.Thread(target=self._run, name="nanocrab-span-export", daemon=True)
        self._thread.start()

    # -- the event loop's side: cheap ------------------------------------------------------

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is None or not ctx.trace_flags.sampled or self._stopping:
            return
        with self._lock:
            if len(self._spans) >= self.max_queue:
                self.dropped += 1
                return
            self._spans.append(span)
            full = len(self._spans) >= self.batch
        if full:
            self._wake.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand over every span ended so far and wait until the child has exported them."""
        if not self._thread.is_alive():
            return False  # shut down: nothing will hand them over
        done = threading.Event()
        with self._lock:
            self._flushes.append(done)
        self._wake.set()
        return done.wait(timeout_millis / 1000)

    def shutdown(self) -> None:
        if self._stopping:
            return
        self.force_flush(10_000)
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=15)

    # -- the hand-over thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            with self._lock:
                spans, self._spans = self._spans, []
                flushes, self._flushes = self._flushes, []
            for start in range(0, len(spans), self.batch):
                self._send_spans(spans[start : start + self.batch])
            if flushes:
                ok = self._flush_child()
                for done in flushes:
                    if ok:
                        done.set()
            if self._stopping:
                self._stop_child()
                return

    def _child(self) -> subprocess.Popen[bytes] | None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            return proc
        if proc is not None:
            log.warning("the span export process ended (exit %s): starting it again",
                        proc.returncode)  # fmt: skip
            self._proc = None
        if time.monotonic() - self._started_at < RESTART_S:
            return None
        self._started_at = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        except OSError as exc:
            log.warning("cannot start the span export process (%s): spans are dropped", exc)
            return None
        return self._proc

    def _write(self, message: list[Any]) -> bool:
        frame = _encoder.encode(message)
        frame = _HEADER.pack(len(frame)) + frame
        for _attempt in range(2):  # a child found dead only by the write: once more, anew
            proc = self._child()
            if proc is None or proc.stdin is None:
                return False
            try:
                proc.stdin.write(frame)
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                proc.kill()  # it closed its end: it is gone or going
                proc.wait()
                continue
            return True
        return False

    def _send_spans(self, spans: list[ReadableSpan]) -> None:
        resources: dict[int, int] = {}
        table: list[Any] = []
        rows = []
        for span in spans:
            res = span.resource
            index = resources.get(id(res))
            if index is None:
                index = resources[id(res)] = len(table)
                table.append([_attrs(res.attributes), res.schema_url])
            rows.append(_row(span, index))
        if self._write(["spans", table, rows]):
            self.handed_over += len(spans)
        else:
            self.dropped += len(spans)
            log.warning("%d spans dropped: the span export process is not running", len(spans))

    def _flush_child(self) -> bool:
        if self._proc is None and not self.dropped:
            return True  # nothing was ever handed over: nothing to wait for
        self._flush_count += 1
        token = self._flush_count
        if not self._write(["flush", token]):
            return False
        proc = self._proc
        out: IO[bytes] | None = proc.stdout if proc is not None else None
        while out is not None:
            line = out.readline()
            if not line:
                return False  # the child died before it answered
            if line.strip() == f"flushed {token}".encode():
                return True
        return False

    def _stop_child(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._write(["stop"])
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _row(span: ReadableSpan, resource: int) -> list[Any]:
    ctx = span.context
    assert ctx is not None
    parent = span.parent
    scope = span.instrumentation_scope
    status = span.status
    return [
        span.name,
        ctx.trace_id.to_bytes(16, "big"),
        ctx.span_id,
        int(ctx.trace_flags),
        [parent.span_id, parent.is_remote] if parent is not None else None,
        span.kind.value,
        span.start_time,
        span.end_time,
        status.status_code.value,
        status.description,
        _attrs(span.attributes),
        [[e.name, e.timestamp, _attrs(e.attributes)] for e in span.events],
        [
            [
                link.context.trace_id.to_bytes(16, "big"),
                link.context.span_id,
                int(link.context.trace_flags),
                _attrs(link.attributes),
            ]
            for link in span.links
        ],
        resource,
        [scope.name, scope.version, scope.schema_url] if scope is not None else None,
    ]


# -- the child ------------------------------------------------------------------------------


def _rebuild(resources: list[Any], rows: list[Any]) -> list[ReadableSpan]:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode

    def context(trace: bytes | int, span_id: int, flags: int, remote: bool) -> SpanContext:
        trace_id = trace if isinstance(trace, int) else int.from_bytes(trace, "big")
        return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=TraceFlags(flags))

    res = [Resource(attrs, schema_url) for attrs, schema_url in resources]
    spans = []
    for row in rows:
        (name, trace_b, span_id, flags, parent, kind, start, end, code, description,
         attributes, events, links, resource, scope) = row  # fmt: skip
        trace_id = int.from_bytes(trace_b, "big")
        spans.append(
            ReadableSpan(
                name=name,
                context=context(trace_id, span_id, flags, False),
                parent=context(trace_id, parent[0], flags, parent[1]) if parent else None,
                resource=res[resource],
                attributes=attributes,
                events=[Event(n, a, ts) for n, ts, a in events],
                links=[Link(context(t, s, f, True), a) for t, s, f, a in links],
                kind=SpanKind(kind),
                status=Status(StatusCode(code), description),
                start_time=start,
                end_time=end,
                instrumentation_scope=InstrumentationScope(*scope) if scope else None,
            )
        )
    return spans


def child(inp: IO[bytes] | None = None, out: IO[bytes] | None = None) -> None:
    """The child's loop: read frames from ``inp`` (stdin), export, answer flushes on ``out``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    inp = inp if inp is not None else sys.stdin.buffer
    out = out if out is not None else sys.stdout.buffer
    exporter = OTLPSpanExporter()
    decoder = msgspec.msgpack.Decoder()
    try:
        while True:
            head = inp.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return  # the parent is gone
            (size,) = _HEADER.unpack(head)
            message = decoder.decode(inp.read(size))
            if message[0] == "spans":
                exporter.export(_rebuild(message[1], message[2]))
            elif message[0] == "flush":
                out.write(f"flushed {message[1]}\n".encode())
                out.flush()
            elif message[0] == "stop":
                return
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    child()
