"""One subscription for several projectors (projections/feed.py), on a real nats-server: each
member receives exactly what a subscription of its own would deliver from its start — every
matching event once, in log order — whatever the others do (start earlier or later, attach
again from further back, stop taking)."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from nanocrab.bus import EventLog, read
from nanocrab.events import ReplySent
from nanocrab.projections.feed import Batcher, SharedFeed


async def take(batcher: Batcher, count: int, timeout_s: float = 30.0) -> list[int]:
    """The stream sequences of the next ``count`` events handed to ``batcher``."""
    seqs: list[int] = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(seqs) < count:
        left = deadline - asyncio.get_running_loop().time()
        assert left > 0, f"only {len(seqs)} of {count} events arrived: {seqs}"
        batch = await batcher.take(min(left, 1.0))
        seqs += [s.seq for s, _ in batch or []]
    return seqs


async def append(log: EventLog, runs: list[str]) -> list[int]:
    return [(await log.append(ReplySent(text=f"to {r}", run_id=r))).seq for r in runs]


async def own_subscription(log: EventLog, subject: str, start: int, end: int) -> list[int]:
    """What a subscription of its own delivers of ``subject`` from ``start`` up to ``end``."""
    out = []
    async for s in read(log, subject):
        if start <= s.seq <= end:
            out.append(s.seq)
    return out


async def test_members_with_their_own_filters_and_starts_get_what_their_own_subscription_would(
    log: EventLog,
) -> None:
    runs = f"{log.subjects.root}.*.run.>"
    one_run = log.subjects.run("feed-a")
    first = await append(log, ["feed-a", "feed-b", "feed-a"])
    feed = SharedFeed(log)
    every, only_a, later = (Batcher(1000, 0.005) for _ in range(3))
    try:
        await feed.attach("every", runs, first[0], every)
        await feed.attach("only_a", one_run, first[0], only_a)
        more = await append(log, ["feed-b", "feed-a"])
        await feed.attach("later", runs, more[0], later)  # starts after the first events
        last = (await append(log, ["feed-a", "feed-b"]))[-1]

        assert await take(every, 7) == await own_subscription(log, runs, first[0], last)
        assert await take(only_a, 4) == await own_subscription(log, one_run, first[0], last)
        assert await take(later, 4) == await own_subscription(log, runs, more[0], last)
        assert not every.buf and not only_a.buf and not later.buf  # nothing twice
    finally:
        await feed.close()


async def test_a_member_attaching_again_from_further_back_is_given_it_again_the_others_not(
    log: EventLog,
) -> None:
    scope = log.subjects.run("feed-c")
    seqs = await append(log, ["feed-c"] * 4)
    feed = SharedFeed(log)
    retrying, steady = Batcher(1000, 0.005), Batcher(1000, 0.005)
    try:
        await feed.attach("retrying", scope, seqs[0], retrying)
        await feed.attach("steady", scope, seqs[0], steady)
        assert await take(retrying, 4) == seqs
        assert await take(steady, 4) == seqs
        # a projector whose batch failed follows again from its checkpoint (here: the start)
        again = Batcher(1000, 0.005)
        await feed.attach("retrying", scope, seqs[1], again)
        assert retrying.closed  # the batcher it had is not fed any more
        new = await append(log, ["feed-c"])
        assert await take(again, 4) == [*seqs[1:], *new]
        assert await take(steady, 1) == new
        assert not steady.buf and not again.buf
    finally:
        await feed.close()


async def test_a_member_that_stops_taking_holds_the_others_only_until_it_detaches(
    log: EventLog,
) -> None:
    scope = log.subjects.run("feed-d")
    feed = SharedFeed(log)
    stuck, moving = Batcher(1, 0.005), Batcher(1000, 0.005)  # room for 8 in the stuck one
    start = (await append(log, ["feed-d"]))[0]
    try:
        await feed.attach("stuck", scope, start, stuck)
        await feed.attach("moving", scope, start, moving)
        seqs = [start, *await append(log, ["feed-d"] * 19)]
        assert await take(moving, 8) == seqs[:8]  # then the delivery waits for room
        await feed.detach("stuck")  # its projector stopped following: the others go on
        assert await take(moving, 12) == seqs[8:]
    finally:
        await feed.close()


async def test_a_restart_that_fails_leaves_no_member_behind_and_ensure_subscribes_again(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = log.subjects.run("feed-e")
    seqs = await append(log, ["feed-e"] * 2)
    feed = SharedFeed(log)
    steady, failed = Batcher(1000, 0.005), Batcher(1000, 0.005)
    try:
        await feed.attach("steady", scope, seqs[0], steady)
        assert await take(steady, 2) == seqs
        subscribe = log.js.subscribe

        async def refused(*args: object, **kwargs: object) -> object:
            raise nats.errors.TimeoutError

        monkeypatch.setattr(log.js, "subscribe", refused)
        with pytest.raises(nats.errors.TimeoutError):  # a restart from further back fails
            await feed.attach("failed", scope, seqs[0], failed)
        monkeypatch.setattr(log.js, "subscribe", subscribe)
        new = await append(log, ["feed-e"])
        await feed.ensure()  # what an idle member does: the subscription is back
        assert await take(steady, 1) == new
        assert not failed.buf  # not a member: given nothing
    finally:
        await feed.close()
