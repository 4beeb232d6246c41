"""A bus failure while an event is handled is the bus's, not the event's: retried, never
dead-lettered, and never acknowledged before the reaction is stored.

Found on a three-node cluster (tests/test_scale_failover.py): while the survivors elected a new
stream leader, a handler's read of the run timed out (``BusError``), the runtime took it for a
poison event and terminated the delivery, and the run stopped for good.
"""

from __future__ import annotations

from collections.abc import Sequence

import nats.errors
import pytest

from nanocrab.bus import (
    BusError,
    Delivery,
    EventLog,
    HandlerRuntime,
    PublishRefused,
    RuntimeOptions,
    read,
)
from nanocrab.bus.log import Appended
from nanocrab.events import BusDeadLettered, Event, RunStarted, TaskSubmitted

from .conftest import eventually, running

FAST = RuntimeOptions(fetch_timeout_s=0.5, ack_wait_s=1.0, backoff_s=(0.1, 0.2), max_deliver=5)


class ReadsTheLog:
    """Reads the log before deciding; the first ``failures`` reads fail as a read does while a
    replicated stream has no leader (``failure`` is what the read raises)."""

    name = "reader"
    consumes: tuple[type[Event], ...] = (TaskSubmitted,)

    def __init__(self, failures: int, failure: Exception) -> None:
        self.failures = failures
        self.failure = failure
        self.calls = 0

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.failure
        return [RunStarted()]


class AcksGetLost(EventLog):
    """The real log, whose first ``failures`` batch appends get no acknowledgement in time (as
    during a leader election: stored or not, nobody knows)."""

    failures = 0

    async def append_batch(self, events: Sequence[Event]) -> list[Appended]:
        if self.failures > 0:
            self.failures -= 1
            raise BusError(f"no acknowledgement for batch of {len(events)} within 5.0s")
        return await super().append_batch(events)


async def stored(log: EventLog, subject: str) -> list[Event]:
    return [s.event async for s in read(log, subject) if s.event is not None]


async def dead_letters(log: EventLog) -> list[Event]:
    return [
        e
        for e in await stored(log, log.subjects.of_type("bus.dead_lettered"))
        if isinstance(e, BusDeadLettered)
    ]


@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize(
    "failure",
    [
        BusError("message get on NANOCRAB_LOG failed: TimeoutError()"),
        nats.errors.TimeoutError(),
        nats.errors.NoRespondersError(),
    ],
    ids=["bus-error", "nats-timeout", "no-responders"],
)
async def test_a_failed_read_inside_a_handler_is_retried_not_dead_lettered(
    log: EventLog, failure: Exception, concurrency: int
) -> None:
    reactor = ReadsTheLog(failures=2, failure=failure)
    runtime = HandlerRuntime(log, reactor, options=RuntimeOptions(
        fetch_timeout_s=0.5, ack_wait_s=1.0, backoff_s=(0.1, 0.2), max_deliver=5,
        concurrency=concurrency,
    ))  # fmt: skip
    async with running(runtime):
        await log.append(TaskSubmitted(text="read me", run_id="r1"))
        await eventually(lambda: runtime.processed == 1, timeout=15)
    assert reactor.calls == 3
    assert [e.type for e in await stored(log, log.subjects.run("r1"))] == [
        "task.submitted", "run.started",
    ]  # fmt: skip
    assert await dead_letters(log) == [] and runtime.dead_lettered == 0


async def test_a_handler_that_raises_a_refused_publish_is_still_poison(log: EventLog) -> None:
    """A ``PublishRefused`` is a wiring bug, not an outage: retrying cannot help."""
    reactor = ReadsTheLog(failures=100, failure=PublishRefused("llm", "nanocrab.x.y"))
    runtime = HandlerRuntime(log, reactor, options=FAST)
    async with running(runtime):
        await log.append(TaskSubmitted(text="refused", run_id="r2"))
        await eventually(lambda: runtime.dead_lettered == 1, timeout=15)
    assert reactor.calls == 1
    (letter,) = await dead_letters(log)
    assert isinstance(letter, BusDeadLettered) and letter.reason_kind == "poison"


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_a_reaction_whose_append_is_not_acknowledged_is_retried_before_the_ack(
    log: EventLog, concurrency: int
) -> None:
    flaky = AcksGetLost(log.nc, log.cfg)
    flaky.failures = 2
    reactor = ReadsTheLog(failures=0, failure=RuntimeError())
    runtime = HandlerRuntime(flaky, reactor, options=RuntimeOptions(
        fetch_timeout_s=0.5, ack_wait_s=1.0, backoff_s=(0.1, 0.2), max_deliver=5,
        concurrency=concurrency,
    ))  # fmt: skip
    async with running(runtime):
        await log.append(TaskSubmitted(text="append me", run_id="r3"))
        await eventually(lambda: runtime.processed == 1, timeout=15)
    # handled three times: the delivery was not acknowledged while its reaction was not stored
    assert reactor.calls == 3 and flaky.failures == 0
    assert [e.type for e in await stored(log, log.subjects.run("r3"))] == [
        "task.submitted", "run.started",
    ]  # fmt: skip
    assert await dead_letters(log) == []
