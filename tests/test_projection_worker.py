"""Projectors off the caller's loop: the reader process of a catch-up, and the worker that runs
projectors in a thread or a process. Both keep the contract of the in-loop projector: the same
rows, the checkpoint in the same transaction, exactly once. Run on SQLite and PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import Connector, EventLog
from nanocrab.bus.permissions import CLI, PROJECTOR
from nanocrab.events import ReplySent, RunStarted, TaskSubmitted, new_event_id
from nanocrab.projections import (
    BusSpec,
    ProjectionError,
    ProjectionWorker,
    Projector,
    RunTimelineProjection,
    _reader,
    reopenable,
    run_timeline,
)
from nanocrab.projections.timeline import run_timeline_rows
from nanocrab.projections.worker import WORKER_NICE

from .conftest import eventually
from .test_broker_permissions import bus, secured  # noqa: F401  (fixtures)
from .test_projections import rows, seed


async def test_a_catch_up_read_by_the_reader_process_equals_one_read_here(
    log: EventLog, engine: AsyncEngine
) -> None:
    total = await seed(log, 40)
    here = Projector(log, engine, RunTimelineProjection(), reader_process_min=10**9)
    assert await here.rebuild() == total
    expected = await rows(engine)
    seq = await here.checkpoint()
    apart = Projector(
        log, engine, RunTimelineProjection(), reader_process_min=1, catch_up_batch_size=17
    )
    assert await apart.rebuild() == total
    assert await rows(engine) == expected
    assert await apart.checkpoint() == seq
    # a second catch-up from the checkpoint reads nothing new and changes nothing
    await log.append(ReplySent(text="late", run_id="run0000"))
    assert await apart.catch_up() == 1
    assert len(await rows(engine)) == total + 1


async def test_a_catch_up_far_larger_than_the_reader_may_hold_loses_nothing(
    log: EventLog, sqlite_engine: AsyncEngine
) -> None:
    """Several megabytes through a reader that holds at most 8 batches of 25: the server's
    flow control must hold the rest back until the projector has taken what came first (the
    ordered consumer's flow-control replies wait for the reader's callback)."""
    events = [
        ReplySent(text="x" * 900 + str(i), run_id=f"run{i // 4:05d}", source="t")
        for i in range(6000)
    ]
    for i in range(0, len(events), 500):
        await log.append_batch(events[i : i + 500])
    projector = Projector(
        log, sqlite_engine, RunTimelineProjection(), reader_process_min=1, catch_up_batch_size=25
    )
    assert await projector.rebuild() == len(events)
    stored = [r[1] for r in await rows(sqlite_engine)]  # event ids
    assert sorted(stored) == sorted(e.id for e in events)


async def test_when_the_reader_process_fails_the_catch_up_reads_here(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = await seed(log, 5)
    broken = tmp_path / "reader.py"
    broken.write_text("import sys; sys.exit('no reading today')")
    monkeypatch.setattr(_reader, "__file__", str(broken))
    projector = Projector(log, sqlite_engine, RunTimelineProjection(), reader_process_min=1)
    assert await projector.rebuild() == total
    assert len(await rows(sqlite_engine)) == total


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_the_worker_follows_the_log_and_catches_up_on_stop(
    log: EventLog, engine: AsyncEngine, mode: str
) -> None:
    url = reopenable(engine)
    assert url is not None
    await seed(log, 3)  # before the worker: applied by its first catch-up
    worker = ProjectionWorker(
        BusSpec.of(log, "projector"),
        url,
        [RunTimelineProjection()],
        mode=mode,  # type: ignore[arg-type]
    )
    await worker.start()
    try:
        live = [RunStarted(run_id="live"), ReplySent(text="hi", run_id="live")]
        await log.append_batch(live)

        async def projected() -> bool:
            return len(await run_timeline_rows(engine, "live")) == 2

        await eventually(projected)
        if mode == "thread":
            assert [p.name for p in worker.projectors] == ["run_timeline"]
        else:  # the process yields the cores to the handlers and nats-server when both want one
            assert worker.pid is not None
            ours = os.getpriority(os.PRIO_PROCESS, 0)
            assert os.getpriority(os.PRIO_PROCESS, worker.pid) == min(19, ours + WORKER_NICE)
    finally:
        last = await log.append(ReplySent(text="at the end", run_id="live"))
        await worker.stop(drain_s=10)
    # stop brought it to the end of the log, each event once
    async with engine.connect() as conn:
        ids = list((await conn.execute(select(run_timeline.c.event_id))).scalars())
    assert len(ids) == len(set(ids)) == 3 * 4 + 3
    assert await Projector(log, engine, RunTimelineProjection()).checkpoint() == last.seq


async def test_a_worker_that_cannot_set_up_says_so(log: EventLog, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    worker = ProjectionWorker(
        BusSpec.of(log, "projector"),
        f"sqlite+aiosqlite:///{tmp_path / 'a-file' / 'projections.db'}",
        [RunTimelineProjection()],
        mode="thread",
    )
    with pytest.raises(ProjectionError, match="did not start"):
        await worker.start()


async def test_with_broker_permissions_the_reader_process_reads_as_the_projector(
    bus: Connector,  # noqa: F811
    sqlite_engine: AsyncEngine,
) -> None:
    cli, projector_log = await bus.open(CLI), await bus.open(PROJECTOR)
    task = TaskSubmitted(text="hello", run_id=new_event_id(), source="cli")
    await cli.append(task)
    projector = Projector(
        projector_log, sqlite_engine, RunTimelineProjection(), reader_process_min=1
    )
    assert BusSpec.of(projector_log, PROJECTOR).seed  # it authenticates with its own nkey
    await projector.rebuild()
    assert [r.type for r in await run_timeline_rows(sqlite_engine, task.run_id)] == [
        "task.submitted"
    ]
