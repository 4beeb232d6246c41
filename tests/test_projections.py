"""Projection contract, run on SQLite and on PostgreSQL (when reachable)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.sqlite import DATETIME
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import EventLog, Stored, Subjects
from nanocrab.events import BusMalformed, ReplySent, RunCompleted, RunStarted, TaskSubmitted
from nanocrab.projections import (
    DeadLettersProjection,
    ProjectionFailed,
    Projector,
    RunTimelineProjection,
    checkpoints,
    list_dead_letters,
    run_timeline,
    run_timeline_rows,
)
from nanocrab.projections import db as db_module
from nanocrab.projections import projector as projector_module
from nanocrab.projections.feed import SharedFeed

from .conftest import eventually


async def seed(log: EventLog, runs: int) -> int:
    events = []
    for r in range(runs):
        rid = f"run{r:04d}"
        task = TaskSubmitted(text=f"task {r}", run_id=rid)
        events += [
            task,
            RunStarted(run_id=rid, causation_id=task.id),
            ReplySent(text="hi", run_id=rid),
            RunCompleted(reply="hi", steps=1, run_id=rid),
        ]
    for i in range(0, len(events), 500):
        await log.append_batch(events[i : i + 500])
    return len(events)


async def rows(engine: AsyncEngine) -> list[tuple]:  # type: ignore[type-arg]
    async with engine.connect() as conn:
        result = await conn.execute(select(run_timeline).order_by(run_timeline.c.seq))
        return [tuple(r) for r in result]


async def count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(run_timeline)) or 0)


async def test_catch_up_projects_every_run_event_with_its_checkpoint(
    log: EventLog, engine: AsyncEngine
) -> None:
    total = await seed(log, 30)
    projector = Projector(
        log, engine, RunTimelineProjection(), batch_size=37, catch_up_batch_size=37
    )
    seen: list[tuple[int, int]] = []
    applied = await projector.catch_up(lambda done, of: seen.append((done, of)))
    assert applied == total == await count(engine)
    assert seen[-1] == (total, total)
    assert await projector.checkpoint() == total
    assert await projector.catch_up() == 0, "a second catch-up applies nothing"
    timeline = await run_timeline_rows(engine, "run0003")
    assert [r.type for r in timeline] == [
        "task.submitted",
        "run.started",
        "reply.sent",
        "run.completed",
    ]
    assert timeline[0].summary == "task 3" and timeline[0].since_previous_ms is None
    assert all(r.since_previous_ms is not None and r.since_previous_ms >= 0 for r in timeline[1:])
    assert timeline[1].causation_id is not None


class CrashAfter:
    """Wraps a projection; raises inside ``apply`` once, after writing part of a batch."""

    def __init__(self, inner: RunTimelineProjection, crash_at_seq: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.tables = inner.tables
        self.crash_at_seq = crash_at_seq
        self.crashed = False

    def subject_filter(self, subjects: Subjects) -> str:
        return self.inner.subject_filter(subjects)

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        if not self.crashed and any(s.seq >= self.crash_at_seq for s in batch):
            await self.inner.apply(conn, [s for s in batch if s.seq < self.crash_at_seq])
            self.crashed = True
            raise RuntimeError("projector crashed mid-batch")
        await self.inner.apply(conn, batch)


async def test_projector_crashed_mid_batch_resumes_exactly_once(
    log: EventLog, engine: AsyncEngine
) -> None:
    total = await seed(log, 25)
    flaky = CrashAfter(RunTimelineProjection(), crash_at_seq=60)
    projector = Projector(log, engine, flaky, batch_size=40, catch_up_batch_size=40)
    with pytest.raises(ProjectionFailed, match="mid-batch"):
        await projector.catch_up()
    assert await projector.checkpoint() == 40, "the crashed batch rolled back entirely"
    assert await count(engine) == 40
    restarted = Projector(log, engine, flaky, batch_size=40, catch_up_batch_size=40)
    await restarted.catch_up()
    assert await count(engine) == total
    seqs = [r[0] for r in await rows(engine)]
    assert seqs == list(range(1, total + 1)), "every event exactly once"


class Counting:
    """Wraps a projection; records the sequences of every event handed to ``apply``."""

    def __init__(self, inner: RunTimelineProjection) -> None:
        self.inner = inner
        self.name = inner.name
        self.tables = inner.tables
        self.applied: list[int] = []

    def subject_filter(self, subjects: Subjects) -> str:
        return self.inner.subject_filter(subjects)

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        self.applied += [s.seq for s in batch]
        await self.inner.apply(conn, batch)


async def test_an_instance_behind_the_stored_checkpoint_applies_nothing_again(
    log: EventLog, engine: AsyncEngine
) -> None:
    total = await seed(log, 10)
    counted = Counting(RunTimelineProjection())
    first, second = (Projector(log, engine, counted, catch_up_batch_size=16) for _ in range(2))
    await first.setup()
    await second.setup()  # both start at 0; the first then applies everything
    assert await first.catch_up() == total
    assert await second.catch_up() == 0, "the stored checkpoint is past what it read"
    assert counted.applied == list(range(1, total + 1)), "every event handed over once"
    assert second.position == total
    await seed(log, 2)  # and it carries on from there
    assert await second.catch_up() == 8
    assert counted.applied == list(range(1, total + 9))
    assert await count(engine) == total + 8


async def test_rebuilt_projection_equals_the_incremental_one(
    log: EventLog, engine: AsyncEngine
) -> None:
    await seed(log, 10)
    projector = Projector(log, engine, RunTimelineProjection())
    task = asyncio.create_task(projector.run())
    try:
        for _ in range(5):
            await seed(log, 3)
            await asyncio.sleep(0.05)
        last = await log.stream_last_seq()
        await eventually(lambda: projector.position == last)
    finally:
        projector.stop()
        await asyncio.wait_for(task, 10)
    incremental = await rows(engine)
    assert len(incremental) == last
    rebuilt = await Projector(
        log, engine, RunTimelineProjection(), catch_up_batch_size=64
    ).rebuild()
    assert rebuilt == last
    assert await rows(engine) == incremental


async def test_redelivered_batches_are_no_ops(log: EventLog, engine: AsyncEngine) -> None:
    await seed(log, 5)
    projector = Projector(log, engine, RunTimelineProjection())
    await projector.catch_up()
    from nanocrab.bus import read

    again = [s async for s in read(log, f"{log.cfg.root}.*.run.>")]
    assert await projector.apply_batch(again) == 0
    assert await count(engine) == 20
    async with engine.connect() as conn:
        (pos,) = (await conn.execute(select(checkpoints.c.stream_seq))).one()
    assert pos == 20


async def test_dead_letters_projection(log: EventLog, engine: AsyncEngine) -> None:
    await log.append(
        BusMalformed(
            handler="echo",
            stream=log.cfg.log_stream,
            stream_seq=7,
            subject="x.y",
            reason_kind="malformed",
            reason="bad json",
            preview="{",
            source="echo",
        )
    )
    await seed(log, 2)  # other events are not dead letters
    projector = Projector(log, engine, DeadLettersProjection())
    assert await projector.catch_up() == 1
    (row,) = await list_dead_letters(engine)
    assert (row["handler"], row["stream_seq"], row["reason_kind"]) == ("echo", 7, "malformed")


class _Patient(RunTimelineProjection):
    """A sparse read model that gathers a burst for an hour before it commits."""

    gather_s = 3600.0


async def test_a_stopped_projector_does_not_wait_out_its_gathering_pause(
    log: EventLog, sqlite_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``nanocrab run`` stops its projectors on exit: one holding a burst back for its commit
    interval must apply it and end at once, not when the interval is over."""
    taken: list[int] = []

    class Counting(projector_module.Batcher):
        async def take(self, timeout_s: float) -> list[tuple[Stored, int]] | None:
            batch = await super().take(timeout_s)
            taken.extend(s.seq for s, _ in batch or [])
            return batch

    monkeypatch.setattr(projector_module, "Batcher", Counting)
    projector = Projector(log, sqlite_engine, _Patient(), feed=SharedFeed(log))
    await projector.setup()
    task = asyncio.create_task(projector.run())
    try:
        seq = (await log.append(RunStarted(run_id="held"))).seq
        await eventually(lambda: seq in taken)  # taken: the projector now gathers for an hour
        assert await projector.checkpoint() < seq
        projector.stop()
        await asyncio.wait_for(task, 60)  # before the fix: an hour
    finally:
        task.cancel()
    assert await projector.checkpoint() == seq, "the burst held back is applied on stop"
    assert [r.seq for r in await run_timeline_rows(sqlite_engine, "held")] == [seq]


@pytest.mark.parametrize(
    "when",
    [
        datetime(2026, 11, 24, 16, 31, 4, 815032, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),  # no microseconds: still written out
        datetime(999, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
        datetime(2026, 6, 1, 1, 30, tzinfo=timezone(timedelta(hours=2))),  # stored as UTC
    ],
)
def test_times_are_written_as_sqlalchemy_writes_them_on_sqlite(when: datetime) -> None:
    """The bulk path's own formatting must read back through ``Table`` like SQLAlchemy's."""
    processor = DATETIME().bind_processor(sqlite.dialect())
    assert processor is not None
    assert db_module._sqlite_datetime(when) == processor(when.astimezone(UTC).replace(tzinfo=None))
