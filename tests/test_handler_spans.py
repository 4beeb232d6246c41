"""The handlers' span per handled event made by ``HandlerSpans`` (``bus/tracing.py``), the cheap
path ``configure_tracing`` installs: on a real server, a runtime without a tracer of its own
exports the same span the SDK would — name, kind, trace, parent, attributes, status, the
exception — and the events it appends carry that span's ``traceparent``. An unsampled parent
is followed (no span exported, its flags propagated)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from nanocrab.bus import Delivery, EventLog, HandlerRuntime, read
from nanocrab.bus import tracing as bus_tracing
from nanocrab.bus.tracing import HandlerSpans
from nanocrab.events import Event, RunCompleted, TaskSubmitted
from nanocrab.handlers.echo import EchoReactor

from .conftest import eventually, running
from .test_runtime import FAST

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    spans = HandlerSpans(Resource.create({"service.name": "t"}), [SimpleSpanProcessor(exporter)])
    monkeypatch.setattr(bus_tracing, "_handler_spans", spans)
    return exporter


async def events_of(log: EventLog, run_id: str, until: type[Event]) -> list[Event]:
    async def done() -> list[Event]:
        evs = [s.event async for s in read(log, log.subjects.run(run_id)) if s.event is not None]
        return evs if any(isinstance(e, until) for e in evs) else []

    result: list[Event] = await eventually(done)
    return result


async def test_a_handled_event_s_span_continues_the_trace_and_its_reactions_carry_it(
    log: EventLog, exported: InMemorySpanExporter
) -> None:
    runtime = HandlerRuntime(log, EchoReactor(), options=FAST)
    task = TaskSubmitted(text="ping", run_id="hs1", task_id="hs1", session_id="s1",
                         trace=f"00-{TRACE}-00f067aa0ba902b7-01")  # fmt: skip
    async with running(runtime):
        await log.append(task)
        events = await events_of(log, "hs1", RunCompleted)
    (span,) = [s for s in exported.get_finished_spans() if s.name == "echo task.submitted"]
    assert span.kind == SpanKind.CONSUMER and span.status.status_code == StatusCode.UNSET
    assert span.context is not None and f"{span.context.trace_id:032x}" == TRACE
    assert span.parent is not None and span.parent.span_id == 0x00F067AA0BA902B7
    assert span.parent.is_remote and not span.context.is_remote
    assert span.start_time is not None and span.end_time is not None
    assert span.start_time <= span.end_time
    attrs: dict[str, Any] = dict(span.attributes or {})
    stored = events[0]
    assert attrs["messaging.system"] == "nats" and attrs["nanocrab.handler"] == "echo"
    assert attrs["messaging.message.id"] == stored.id and attrs["nanocrab.run_id"] == "hs1"
    assert attrs["messaging.destination.name"] == log.subjects.for_event(stored)
    assert isinstance(attrs["nanocrab.stream_seq"], int)
    assert span.resource.attributes["service.name"] == "t"
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "nanocrab.bus"
    for reaction in events[1:]:
        assert reaction.trace == f"00-{TRACE}-{span.context.span_id:016x}-01"


class Failing:
    """Raises on every task: the runtime dead-letters it and marks the span."""

    name = "failing"
    consumes: tuple[type[Event], ...] = (TaskSubmitted,)

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        raise RuntimeError("no such luck")


async def test_a_failing_handle_marks_its_span_with_the_exception(
    log: EventLog, exported: InMemorySpanExporter
) -> None:
    runtime = HandlerRuntime(log, Failing(), options=FAST)  # type: ignore[arg-type]
    async with running(runtime):
        await log.append(TaskSubmitted(text="x", run_id="hs2", task_id="hs2"))

        async def failed() -> list[Any]:
            return [s for s in exported.get_finished_spans() if s.name == "failing task.submitted"]

        (span,) = await eventually(failed)
    assert span.status.status_code == StatusCode.ERROR
    assert "no such luck" in (span.status.description or "")
    (event,) = span.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "RuntimeError"
    assert "no such luck" in str(event.attributes["exception.stacktrace"])


async def test_an_unsampled_parent_exports_nothing_and_propagates_its_flags(
    log: EventLog, exported: InMemorySpanExporter
) -> None:
    runtime = HandlerRuntime(log, EchoReactor(), options=FAST)
    task = TaskSubmitted(text="ping", run_id="hs3", task_id="hs3", session_id="s1",
                         trace=f"00-{TRACE}-00f067aa0ba902b7-00")  # fmt: skip
    async with running(runtime):
        await log.append(task)
        events = await events_of(log, "hs3", RunCompleted)
    assert not [s for s in exported.get_finished_spans() if s.attributes
                and s.attributes.get("nanocrab.run_id") == "hs3"]  # fmt: skip
    for reaction in events[1:]:
        assert reaction.trace is not None and reaction.trace.startswith(f"00-{TRACE}-")
        assert reaction.trace.endswith("-00")


class Quiet:
    """Reads every task and appends nothing (a handler dropping a run from its cache)."""

    name = "quiet"
    consumes: tuple[type[Event], ...] = (TaskSubmitted,)

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        return []


@pytest.mark.parametrize(
    ("bound_ns", "kept"),
    [(3_600 * 10**9, False), (1, True)],
    ids=["quicker than the bound: left out", "slower than the bound: kept"],
)
async def test_a_quiet_delivery_is_exported_only_when_it_took_long(
    log: EventLog, monkeypatch: pytest.MonkeyPatch, bound_ns: int, kept: bool
) -> None:
    exporter = InMemorySpanExporter()
    spans = HandlerSpans(Resource.create({"service.name": "t"}), [SimpleSpanProcessor(exporter)],
                         quiet_below_ns=bound_ns)  # fmt: skip
    monkeypatch.setattr(bus_tracing, "_handler_spans", spans)
    quiet = HandlerRuntime(log, Quiet(), options=FAST)  # type: ignore[arg-type]
    echo = HandlerRuntime(log, EchoReactor(), options=FAST)
    async with running(quiet), running(echo):
        await log.append(TaskSubmitted(text="x", run_id="hs4", task_id="hs4"))
        await events_of(log, "hs4", RunCompleted)
        await eventually(lambda: quiet.processed >= 1)
    names = {s.name for s in exporter.get_finished_spans()}
    assert "echo task.submitted" in names, "a delivery that appended is always exported"
    assert ("quiet task.submitted" in names) is kept
