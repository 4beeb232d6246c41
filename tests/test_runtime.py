"""The handler runtime on a real server: reactions, tracing, crash safety, dead letters."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence

import pytest
from nats.aio.msg import Msg
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nanocrab.bus import (
    Delivery,
    EventLog,
    HandlerRuntime,
    Reactor,
    RuntimeOptions,
    TransientError,
    read,
)
from nanocrab.bus import acks as acks_module
from nanocrab.bus.acks import DeferredAcks
from nanocrab.events import (
    BusDeadLettered,
    BusMalformed,
    Codec,
    Event,
    ReplySent,
    RunCancelled,
    RunCompleted,
    RunStarted,
    TaskSubmitted,
    derive_event_id,
)
from nanocrab.handlers.echo import EchoReactor

from .conftest import eventually, running

FAST = RuntimeOptions(fetch_timeout_s=0.5, ack_wait_s=1.0, backoff_s=(0.1, 0.2), max_deliver=3)


async def events_of(log: EventLog, subject: str) -> list[Event]:
    return [s.event async for s in read(log, subject) if s.event is not None]


async def run_events(log: EventLog, run_id: str) -> list[Event]:
    return await events_of(log, log.subjects.run(run_id))


async def test_echo_reacts_with_derived_ids_causation_and_a_continued_trace(log: EventLog) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runtime = HandlerRuntime(log, EchoReactor(), options=FAST, tracer=provider.get_tracer("t"))
    task = TaskSubmitted(text="ping", run_id="run1", task_id="run1", session_id="s1")
    async with running(runtime):
        await log.append(task)

        async def done() -> list[Event]:
            evs = await run_events(log, "run1")
            return evs if any(isinstance(e, RunCompleted) for e in evs) else []

        events = await eventually(done)
    assert [e.type for e in events] == [
        "task.submitted",
        "run.started",
        "reply.sent",
        "run.completed",
    ]
    stored_task = events[0]
    for i, reaction in enumerate(events[1:]):
        assert reaction.id == derive_event_id("echo", stored_task.id, i)
        assert reaction.causation_id == stored_task.id
        assert reaction.source == "echo"
        assert (reaction.run_id, reaction.task_id, reaction.session_id) == ("run1", "run1", "s1")
    assert isinstance(events[2], ReplySent) and events[2].text == "echo: ping"
    # one span for the handled event, in the submitter's trace; reactions carry that span's context
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "echo task.submitted"]
    assert stored_task.trace is not None
    trace_id = stored_task.trace.split("-")[1]
    assert f"{span.context.trace_id:032x}" == trace_id
    assert (
        span.parent is not None and f"{span.parent.span_id:016x}" == stored_task.trace.split("-")[2]
    )
    for reaction in events[1:]:
        assert reaction.trace == f"00-{trace_id}-{span.context.span_id:016x}-01"


async def test_reactor_killed_after_appending_but_before_ack_makes_no_duplicates(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    acks = 0
    original_ack = DeferredAcks.add

    def crash_instead_of_ack(self: DeferredAcks, msg: Msg) -> None:
        nonlocal acks
        acks += 1
        raise asyncio.CancelledError  # the process dies between the appends and the ack

    monkeypatch.setattr(DeferredAcks, "add", crash_instead_of_ack)
    first = HandlerRuntime(log, EchoReactor(), options=FAST)
    crashed = asyncio.create_task(first.run())
    await log.append(TaskSubmitted(text="once", run_id="r1"))
    await eventually(lambda: acks)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(crashed, 5)
    assert crashed.done()
    assert len(await run_events(log, "r1")) == 4, "reactions were appended before the crash"

    monkeypatch.setattr(DeferredAcks, "add", original_ack)
    second = HandlerRuntime(log, EchoReactor(), options=FAST)
    async with running(second):
        # the unacked event is redelivered to the restarted handler, which reacts again...
        await eventually(lambda: second.processed == 1, timeout=15)
        await eventually(_no_ack_pending(log, "echo"))
    events = await run_events(log, "r1")
    assert [e.type for e in events] == [
        "task.submitted",
        "run.started",
        "reply.sent",
        "run.completed",
    ]


async def test_a_stopping_runtime_sends_the_acks_it_held_back(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acks wait for the connection's next message (``bus/acks.py``); a handler that stops
    must not leave them behind, or a restart would handle those events again."""
    monkeypatch.setattr(acks_module, "ACK_DELAY_S", 3600.0)  # only the stop can send it
    runtime = HandlerRuntime(log, EchoReactor(), options=FAST)
    async with running(runtime):
        await log.append(TaskSubmitted(text="held", run_id="r-held"))
        await eventually(lambda: runtime.processed == 1)
    await eventually(_no_ack_pending(log, "echo"))


def _no_ack_pending(log: EventLog, durable: str):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        info = await log.js.consumer_info(log.cfg.log_stream, durable)
        return info.num_ack_pending == 0 and info.num_pending == 0

    return check


async def test_bad_input_is_dead_lettered_and_processing_continues(log: EventLog) -> None:
    subject = f"{log.cfg.root}.default.run.rx.task.submitted"
    valid = json.loads(Codec().encode(TaskSubmitted(text="fine", run_id="rx")))
    bad = {
        "malformed": b'{"specversion": "1.0", "id": ',
        "unknown_type": json.dumps({**valid, "id": "u1", "type": "task.teleported"}).encode(),
        "invalid": json.dumps({**valid, "id": "m1", "data": {}}).encode(),
        "oversized": json.dumps({**valid, "id": "o1", "data": {"text": "x" * 300_000}}).encode(),
    }
    seqs = {}
    for kind, payload in bad.items():
        ack = await log.js.publish(subject, payload, headers={"Nats-Msg-Id": kind})
        seqs[kind] = ack.seq
    runtime = HandlerRuntime(log, EchoReactor(), options=FAST)
    async with running(runtime):
        await log.append(TaskSubmitted(text="after the garbage", run_id="ok"))
        await eventually(lambda: _completed(log, "ok"))
        await eventually(_no_ack_pending(log, "echo"))
    records = await events_of(log, f"{log.cfg.root}.*.system.*.bus.*")
    assert all(isinstance(r, BusMalformed) for r in records)
    by_kind = {r.reason_kind: r for r in records}  # type: ignore[attr-defined]
    assert set(by_kind) == set(bad)
    for kind, seq in seqs.items():
        record = by_kind[kind]
        assert record.stream_seq == seq and record.handler == "echo" and record.reason
        assert record.subject == subject
        raw = await log.get(record.stream_seq)
        assert raw.data == bad[kind], "the dead letter points at the original bytes"
    assert "text" in by_kind["invalid"].reason
    assert "task.teleported" in by_kind["unknown_type"].reason
    assert runtime.dead_lettered == 4


async def _completed(log: EventLog, run_id: str) -> bool:
    return any(isinstance(e, RunCompleted) for e in await run_events(log, run_id))


class Flaky:
    """Fails transiently ``failures`` times, then raises a bug on 'poison' tasks."""

    name = "flaky"
    consumes: tuple[type[Event], ...] = (TaskSubmitted,)

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        assert isinstance(event, TaskSubmitted)
        self.calls += 1
        if event.text == "poison":
            raise KeyError("no such thing")
        if self.calls <= self.failures:
            raise TransientError("upstream busy")
        return [RunStarted()]


async def test_transient_failures_are_retried_with_backoff(log: EventLog) -> None:
    reactor = Flaky(failures=2)
    runtime = HandlerRuntime(log, reactor, options=FAST)
    async with running(runtime):
        await log.append(TaskSubmitted(text="eventually", run_id="r1"))
        await eventually(lambda: runtime.processed == 1, timeout=15)
    assert reactor.calls == 3
    assert [e.type for e in await run_events(log, "r1")] == ["task.submitted", "run.started"]


async def test_poison_and_exhausted_retries_become_dead_letters(log: EventLog) -> None:
    reactor: Reactor = Flaky(failures=100)
    runtime = HandlerRuntime(log, reactor, options=FAST)
    async with running(runtime):
        await log.append(TaskSubmitted(text="poison", run_id="p", tenant="acme"))
        await log.append(TaskSubmitted(text="never works", run_id="n"))
        await eventually(lambda: runtime.dead_lettered == 2, timeout=20)
        await eventually(_no_ack_pending(log, "flaky"))
    records = await events_of(log, f"{log.cfg.root}.*.system.*.bus.*")
    assert all(isinstance(r, BusDeadLettered) for r in records)
    kinds = sorted(r.reason_kind for r in records)  # type: ignore[attr-defined]
    assert kinds == ["max_deliveries", "poison"]
    poison = next(r for r in records if r.reason_kind == "poison")  # type: ignore[attr-defined]
    assert "KeyError" in poison.reason  # type: ignore[attr-defined]
    assert poison.tenant == "acme", "a dead letter stays with the original's tenant"


async def test_two_instances_share_one_durable_and_split_the_work(log: EventLog) -> None:
    a = HandlerRuntime(log, EchoReactor(), options=FAST)
    b = HandlerRuntime(log, EchoReactor(), options=FAST)
    async with running(a), running(b):
        await log.append_batch([TaskSubmitted(text=str(i), run_id=f"r{i}") for i in range(40)])
        await eventually(lambda: a.processed + b.processed == 40, timeout=15)
    info = await log.js.stream_info(log.cfg.log_stream)
    assert info.state.messages == 40 * 4


async def test_stop_is_prompt_and_graceful(log: EventLog) -> None:
    runtime = HandlerRuntime(log, EchoReactor(), options=RuntimeOptions(fetch_timeout_s=30))
    task = asyncio.create_task(runtime.run())
    await asyncio.sleep(0.3)
    runtime.stop()
    await asyncio.wait_for(task, 2)


class Slow:
    """Takes longer than the consumer's ack wait."""

    name = "slow"
    consumes: tuple[type[Event], ...] = (TaskSubmitted,)

    def __init__(self) -> None:
        self.calls = 0

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        self.calls += 1
        await asyncio.sleep(2.5)
        return [RunStarted()]


async def test_long_work_sends_in_progress_acks_and_is_not_redelivered(log: EventLog) -> None:
    reactor = Slow()
    runtime = HandlerRuntime(log, reactor, options=FAST)  # ack_wait 1s
    async with running(runtime):
        await log.append(TaskSubmitted(text="take your time", run_id="r1"))
        await eventually(lambda: runtime.processed == 1, timeout=15)
        await asyncio.sleep(1.5)  # a redelivery would have arrived by now
    assert reactor.calls == 1
    assert [e.type for e in await run_events(log, "r1")] == ["task.submitted", "run.started"]


async def test_an_existing_consumer_gets_the_filters_of_a_newer_handler(log: EventLog) -> None:
    """A data directory made by an older version keeps its durable; a handler that now consumes
    more event types must still receive them (its position kept)."""

    class Wider(EchoReactor):
        consumes = (TaskSubmitted, RunCancelled)

    old = HandlerRuntime(log, EchoReactor(), options=FAST)
    await old.ensure_consumer()
    new = HandlerRuntime(log, Wider(), options=FAST)
    assert sorted(new.filters) != sorted(old.filters)
    await new.ensure_consumer()
    info = await log.js.consumer_info(log.cfg.log_stream, new.durable)
    assert sorted(info.config.filter_subjects or []) == sorted(new.filters)
