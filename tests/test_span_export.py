"""OTLP export from a child process (``nanocrab/bus/span_export.py``), against a real OTLP/HTTP
receiver on loopback: the collector gets what the SDK's in-process exporter sends, a flush waits
for the export, and a child that dies is replaced."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.status import Status, StatusCode

from nanocrab.bus import span_export
from nanocrab.bus.span_export import ChildSpanProcessor
from nanocrab.bus.tracing import HandlerSpans

from .otlp_receiver import Receiver, Span


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    r = Receiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.endpoint)  # the child inherits it
    try:
        yield r
    finally:
        r.stop()


def some_spans(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("nanocrab.test", "7")
    with tracer.start_as_current_span("invoke_agent", kind=SpanKind.INTERNAL) as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        link = Link(root.get_span_context(), {"why": "linked"})
        with tracer.start_as_current_span("chat claude", kind=SpanKind.CLIENT, links=[link]) as s:
            s.set_attributes({"gen_ai.usage.input_tokens": 12, "ratio": 0.5, "ok": True,
                              "gen_ai.response.finish_reasons": ["tool_use", "end_turn"]})  # fmt: skip
            s.add_event("retry", {"attempt": 2})
            s.set_status(Status(StatusCode.ERROR, "overloaded"))


def comparable(spans: list[Span]) -> list[tuple[object, ...]]:
    return sorted(
        (s.name, s.trace_id, s.span_id, s.parent_id, s.kind, s.start_ns, s.end_ns,
         sorted(s.attributes.items(), key=str), s.status_code, s.status_message, s.service)
        for s in spans
    )  # fmt: skip


def test_the_collector_gets_what_the_in_process_exporter_sends(receiver: Receiver) -> None:
    direct = Receiver().start()
    try:
        child = ChildSpanProcessor(delay_s=0.05)
        provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
        provider.add_span_processor(child)
        exporter = OTLPSpanExporter(endpoint=f"{direct.endpoint}/v1/traces")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        some_spans(provider)
        assert child.force_flush(20_000)
        provider.shutdown()
    finally:
        direct.stop()
    assert len(receiver.spans) == 2
    assert comparable(receiver.spans) == comparable(direct.spans)
    root, chat = sorted(receiver.spans, key=lambda s: s.name)[::-1]
    assert chat.parent_id == root.span_id and chat.trace_id == root.trace_id
    assert chat.attributes["gen_ai.response.finish_reasons"] == ["tool_use", "end_turn"]
    assert chat.status_message == "overloaded" and chat.service == "svc"


def test_the_handler_spans_go_through_the_child(receiver: Receiver) -> None:
    child = ChildSpanProcessor(delay_s=0.05)
    spans = HandlerSpans(Resource.create({"service.name": "handlers"}), [child])
    parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    with spans.span("orchestrator handle", parent, {"messaging.system": "nats"}) as opened:
        opened.record_exception(ValueError("bad"))
    assert child.force_flush(20_000)
    child.shutdown()
    (got,) = receiver.spans
    assert (got.trace_id, got.parent_id) == ("ab" * 16, "cd" * 8)
    assert got.attributes == {"messaging.system": "nats"} and got.service == "handlers"


def test_a_flush_waits_for_the_export_and_many_batches_arrive(receiver: Receiver) -> None:
    child = ChildSpanProcessor(delay_s=10.0, batch=50)  # only a full batch or a flush sends
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(child)
    tracer = provider.get_tracer("t")
    for i in range(230):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    assert child.force_flush(20_000)
    assert sorted(s.name for s in receiver.spans) == sorted(f"s{i}" for i in range(230))
    assert child.dropped == 0 and child.handed_over == 230
    provider.shutdown()


def test_a_child_that_dies_is_started_again(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(span_export, "RESTART_S", 0.0)
    child = ChildSpanProcessor(delay_s=0.05)
    provider = TracerProvider()
    provider.add_span_processor(child)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("before"):
        pass
    assert child.force_flush(20_000)
    first = child._proc
    assert first is not None
    first.kill()
    first.wait()
    with caplog.at_level(logging.WARNING, logger="nanocrab.bus.span_export"):
        with tracer.start_as_current_span("after"):
            pass
        assert child.force_flush(20_000)
    assert child._proc is not None and child._proc is not first
    assert "span export process ended" in caplog.text
    assert {s.name for s in receiver.spans} == {"before", "after"}
    provider.shutdown()
    assert child._proc.poll() is not None  # shut down with the provider
    assert child.force_flush(60_000) is False  # at once: nothing left to hand anything over
