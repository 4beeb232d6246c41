"""The handler runtime's hot path: the shared run feed, per-run ordering under concurrency,
chained guards, decisions on a partly stored decision, and admission of new runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest

from nanocrab.bus import (
    Delivery,
    EventLog,
    Expect,
    HandlerRuntime,
    Reaction,
    RuntimeOptions,
    read_run,
)
from nanocrab.bus.reactions import append_reaction
from nanocrab.bus.reactor import handling
from nanocrab.events import (
    Event,
    LlmRequested,
    LlmResponded,
    ReplySent,
    RunCompleted,
    RunStarted,
    TaskSubmitted,
    TextBlock,
    new_event_id,
    utcnow,
)
from nanocrab.handlers import runloader
from nanocrab.handlers.orchestrator import Orchestrator, decide
from nanocrab.handlers.runloader import RunFeed, RunLoader
from nanocrab.handlers.runstate import RunState

from .conftest import eventually


async def _seed(log: EventLog, run: str) -> list[int]:
    seqs = []
    for e in (
        TaskSubmitted(text="t", run_id=run, task_id=run),
        RunStarted(run_id=run, task_id=run, source="orchestrator"),
        LlmRequested(turn=0, run_id=run, source="orchestrator"),
    ):
        seqs.append((await log.append(e)).seq)
    return seqs


def _types(state: RunState) -> list[str]:
    return [e.type for e in state.events]


async def test_the_feed_answers_from_memory_and_matches_the_log(log: EventLog) -> None:
    feed = RunFeed(log)
    loader = RunLoader(log, feed=feed)
    run = new_event_id()
    await feed._ensure_started()
    assert feed.live
    seqs = await _seed(log, run)

    async def prefetched() -> bool:  # the feed reads a new run as its task.submitted arrives
        return feed.reads == 1 and not feed._prefetching

    await eventually(prefetched)
    first = await loader.state(run)  # no delivery in hand: read up to the newest
    assert feed.reads == 2 and _types(first)[-1] == "llm.requested"
    answer = LlmResponded(
        provider="p", model="m", content=[TextBlock("hi")], stop_reason="end_turn", turn=0,
        run_id=run,
    )  # fmt: skip
    appended = await log.append(answer)
    token = handling.set(Delivery(appended.seq, appended.subject))
    try:
        state = await loader.state(run)  # the delivery in hand: the feed reaches it, no read
    finally:
        handling.reset(token)
    assert feed.reads == 2, "the run was known: answered from the feed"
    assert state.seq == appended.seq and state.current and state.current.response is not None
    stored = [s.event.type for s in await read_run(log, run) if s.event is not None]
    assert _types(state) == stored and seqs[0] == state.task_seq
    await feed.close()


async def test_a_new_run_is_read_as_its_task_arrives_not_again_by_the_orchestrator(
    log: EventLog,
) -> None:
    """The orchestrator's first hop: the feed starts reading a new run when its task.submitted
    arrives; with that task in hand, the loader waits for this read instead of making its own."""
    feed = RunFeed(log)
    loader = RunLoader(log, feed=feed)
    run = new_event_id()
    await feed._ensure_started()
    task = await log.append(TaskSubmitted(text="t", run_id=run, task_id=run))
    token = handling.set(Delivery(task.seq, task.subject))
    try:
        state = await loader.state(run)
    finally:
        handling.reset(token)
    assert feed.reads == 1 and _types(state) == ["task.submitted"] and state.seq == task.seq
    await feed.close()


async def test_a_feed_that_lost_track_reads_again(log: EventLog) -> None:
    feed = RunFeed(log, wait_s=0.05)
    loader = RunLoader(log, feed=feed)
    run = new_event_id()
    await feed._ensure_started()
    await _seed(log, run)

    async def prefetched() -> bool:
        return feed.reads == 1 and not feed._prefetching

    await eventually(prefetched)
    await loader.state(run)
    feed._forget_all()  # what a consumer reset or a gap does
    done = await log.append(RunCompleted(reply="x", steps=1, run_id=run, source="orchestrator"))
    token = handling.set(Delivery(done.seq, done.subject))
    try:
        state = await loader.state(run)
    finally:
        handling.reset(token)
    assert feed.reads == 3 and state.status == "completed" and state.seq == done.seq
    await feed.close()


async def test_without_a_delivery_the_loader_reads_up_to_the_newest(log: EventLog) -> None:
    loader = RunLoader(log)
    run = new_event_id()
    await _seed(log, run)
    assert (await loader.state(run)).status == "running"
    await log.append(RunCompleted(reply="x", steps=1, run_id=run, source="orchestrator"))
    assert (await loader.state(run)).status == "completed", "no delivery in hand: the newest"


class _Recorder:
    name = "recorder"
    consumes: tuple[type[Event], ...] = (ReplySent,)
    concurrency = 8

    def __init__(self) -> None:
        self.seen: dict[str, list[str]] = {}
        self.active = 0
        self.most = 0

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        self.active += 1
        self.most = max(self.most, self.active)
        await asyncio.sleep(0.01 if event.text.endswith("0") else 0.002)  # type: ignore[attr-defined]
        self.seen.setdefault(event.run_id or "", []).append(event.text)  # type: ignore[attr-defined]
        self.active -= 1
        return []


@contextlib.asynccontextmanager
async def _running(rt: HandlerRuntime) -> AsyncIterator[HandlerRuntime]:
    task = asyncio.create_task(rt.run())
    try:
        yield rt
    finally:
        rt.stop()
        await asyncio.wait_for(task, 10)


async def test_concurrency_is_across_runs_never_within_one(log: EventLog) -> None:
    reactor = _Recorder()
    opts = RuntimeOptions(fetch_timeout_s=0.5, concurrency=8)
    runs = [new_event_id() for _ in range(4)]
    events = [ReplySent(text=f"{i}", run_id=r) for i in range(5) for r in runs]
    await log.append_batch(events)
    async with _running(HandlerRuntime(log, reactor, options=opts)):

        async def all_handled() -> bool:
            return sum(map(len, reactor.seen.values())) == len(events)

        await eventually(all_handled)
    assert all(seen == ["0", "1", "2", "3", "4"] for seen in reactor.seen.values())
    assert reactor.most > 1, "runs were handled side by side"


async def test_a_chained_reaction_stops_at_the_first_conflict(log: EventLog) -> None:
    run = new_event_id()
    task = TaskSubmitted(text="t", run_id=run, task_id=run)
    at = (await log.append(task)).seq
    scope = log.subjects.run(run)
    racer = Reaction([LlmRequested(turn=0)], expect=Expect(at, scope))
    mine = Reaction([RunStarted(), LlmRequested(turn=0)], expect=Expect(at, scope), chained=True)
    first = await append_reaction(log, "a", task, Reaction([RunStarted()], expect=racer.expect))
    assert first
    assert not await append_reaction(log, "b", task, mine), "the run moved: nothing of it"
    stored = [s.event.type for s in await read_run(log, run) if s.event is not None]
    assert stored == ["task.submitted", "run.started"]


def _answered(run: str) -> list[Event]:
    return [
        TaskSubmitted(text="t", run_id=run),
        RunStarted(max_steps=5),
        LlmRequested(turn=0),
        LlmResponded(
            provider="p", model="m", content=[TextBlock("done")], stop_reason="end_turn", turn=0
        ),
    ]


def test_a_decision_half_stored_is_completed_not_repeated() -> None:
    state = RunState("r")
    for i, e in enumerate(_answered("r"), 1):
        state.apply(e, i)
    assert [e.type for e in decide(state, utcnow())] == ["reply.sent", "run.completed"]
    state.apply(ReplySent(text="done"), 9)  # another instance's first half landed
    assert [e.type for e in decide(state, utcnow())] == ["run.completed"]


async def test_new_runs_wait_while_many_are_moving(log: EventLog) -> None:
    orchestrator = Orchestrator(log)
    orchestrator.busy_runs = 2
    assert orchestrator.admit() and orchestrator.admit()
    assert not orchestrator.admit(), "two started since the last count"
    orchestrator._busy_checked = 0.0
    orchestrator._moving = {"r1": 0.0}  # moved long ago: waiting on someone, not counted
    assert orchestrator.admit()


class _Gated:
    """Handles ``reply.sent`` only when its gate is open, recording the order it starts them."""

    name = "gated"
    consumes: tuple[type[Event], ...] = (ReplySent,)
    concurrency = 2
    known_runs_first = frozenset({"reply.sent"})

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gate = asyncio.Event()

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        self.started.append(event.text)  # type: ignore[attr-defined]
        await self.gate.wait()
        return []


@contextlib.asynccontextmanager
async def _opened(gate: asyncio.Event) -> AsyncIterator[None]:
    try:
        yield
    finally:
        gate.set()  # also when the test failed: the runtime's stop waits for its handlers


async def test_a_run_already_going_goes_before_runs_new_to_the_handler(log: EventLog) -> None:
    """In a burst, a handler that takes its deliveries in order moves every run one step before
    any run a second step, so all complete together at the very end; ``known_runs_first`` puts
    the next event of a run it has handled before the first events of runs it has not."""
    reactor = _Gated()
    opts = RuntimeOptions(fetch_timeout_s=60.0, concurrency=2)  # the open pull outlives the test
    going, new = new_event_id(), [new_event_id() for _ in range(4)]
    async with _running(HandlerRuntime(log, reactor, options=opts)), _opened(reactor.gate):
        await log.append(ReplySent(text="going-1", run_id=going))
        await eventually(lambda: reactor.started == ["going-1"])
        await log.append_batch([ReplySent(text=f"new-{i}", run_id=r) for i, r in enumerate(new)])
        await eventually(lambda: len(reactor.started) == 2)  # both slots taken
        await log.append(ReplySent(text="going-2", run_id=going))

        async def all_delivered() -> bool:  # every event is in the handler's hands
            info = await log.js.consumer_info(log.cfg.log_stream, reactor.name)
            return info.num_pending == 0 and info.num_ack_pending == 6

        await eventually(all_delivered)
        reactor.gate.set()
        await eventually(lambda: len(reactor.started) == 6)
    assert reactor.started[:2] == ["going-1", "new-0"]
    assert reactor.started[2] == "going-2", reactor.started
    assert reactor.started[3:] == ["new-1", "new-2", "new-3"], "the new runs keep their order"


async def test_the_feed_lets_runs_that_ended_go_before_runs_in_flight(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a burst the feed holds every run in flight; what it lets go first is the runs that
    ended (the oldest end first), so a run in flight is not read from the log again."""
    monkeypatch.setattr(runloader, "ENDED_CAPACITY", 2)
    feed = RunFeed(log, capacity=3)
    loader = RunLoader(log, feed=feed)
    await feed._ensure_started()
    live = [new_event_id() for _ in range(2)]
    ended = [new_event_id() for _ in range(3)]
    await _seed(log, live[0])
    await loader.state(live[0])  # the least recently used from here on
    for run in ended:
        await _seed(log, run)
        await log.append(RunCompleted(reply="x", steps=1, run_id=run, source="orchestrator"))
        await loader.state(run)
    await _seed(log, live[1])
    await loader.state(live[1])
    assert set(feed._runs) == {*live, ended[-1]}  # by use alone: ended[1:] and live[1]
    reads = feed.reads
    answer = LlmResponded(
        provider="p", model="m", content=[TextBlock("hi")], stop_reason="end_turn", turn=0,
        run_id=live[0],
    )  # fmt: skip
    appended = await log.append(answer)
    token = handling.set(Delivery(appended.seq, appended.subject))
    try:
        state = await loader.state(live[0])
    finally:
        handling.reset(token)
    assert feed.reads == reads and state.seq == appended.seq, "held: answered from the feed"
    await feed.close()
