"""A nats-server stopped and restarted mid-stream: nothing committed is lost or applied twice."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from nanocrab.bus import (
    BusConfig,
    BusError,
    EmbeddedServer,
    EventLog,
    HandlerRuntime,
    connect,
    read,
)
from nanocrab.bus.connection import reconnects_of
from nanocrab.bus.server import free_port
from nanocrab.events import RunCompleted, TaskSubmitted
from nanocrab.handlers.echo import EchoReactor
from nanocrab.projections import (
    Projector,
    RunTimelineProjection,
    SessionsProjection,
    make_engine,
    run_timeline,
)
from nanocrab.projections.feed import SharedFeed

from .conftest import eventually
from .test_runtime import FAST

TASKS = 60


@pytest.mark.parametrize("shared", [False, True], ids=["own subscription", "shared feed"])
async def test_server_restart_mid_stream(tmp_path: Path, shared: bool) -> None:
    server = EmbeddedServer(tmp_path / "data", port=free_port())
    url = server.start()
    cfg = BusConfig(url=url, data_dir=tmp_path, root="restart")
    nc = await connect(url, name="restart-test")
    log = await EventLog.open(nc, cfg)
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}")
    runtime = HandlerRuntime(log, EchoReactor(), options=FAST)
    # shared: the timeline follows the log through one subscription with another projection,
    # as in the projection worker (projections/feed.py); both re-attach after the restart
    feed = SharedFeed(log) if shared else None
    projector = Projector(log, engine, RunTimelineProjection(), stall_s=2.0, feed=feed)
    others = [Projector(log, engine, SessionsProjection(), feed=feed)] if shared else []
    for p in (projector, *others):
        await p.setup()  # one after the other, as the worker does: SQLite's DDL does not race
    tasks = [asyncio.create_task(p.run()) for p in (projector, *others)]
    tasks.append(asyncio.create_task(runtime.run()))
    published = 0

    async def publish_all() -> None:
        nonlocal published
        for i in range(TASKS):
            event = TaskSubmitted(text=f"t{i}", run_id=f"run{i:03d}")
            while True:  # a publisher retries the *same* event: its id makes that safe
                try:
                    await log.append(event)
                    break
                except BusError:
                    await asyncio.sleep(0.1)
            published += 1
            await asyncio.sleep(0.02)

    publisher = asyncio.create_task(publish_all())
    try:
        await eventually(lambda: published >= TASKS // 3)
        await asyncio.to_thread(server.stop)
        await asyncio.sleep(1.0)
        assert server.start() == url
        assert published < TASKS, "the restart happened mid-stream"
        await asyncio.wait_for(publisher, 60)

        async def all_done() -> bool:
            done = [s async for s in read(log, f"{cfg.root}.*.run.*.run.completed")]
            return len(done) == TASKS

        await eventually(all_done, timeout=45)
        last = await log.stream_last_seq()
        every = (projector, *others)
        await eventually(lambda: all(p.position == last for p in every), 30)

        assert reconnects_of(nc).generation >= 1, "the client really lost the server"
        stored = [s async for s in read(log, f"{cfg.root}.*.run.>")]
        assert all(s.event is not None for s in stored)
        per_run = Counter(s.event.run_id for s in stored if s.event)
        assert per_run == {f"run{i:03d}": 4 for i in range(TASKS)}, "no reaction lost or doubled"
        assert sum(isinstance(s.event, RunCompleted) for s in stored) == TASKS
        async with engine.connect() as conn:
            rows = await conn.scalar(select(func.count()).select_from(run_timeline))
            distinct = await conn.scalar(select(func.count(func.distinct(run_timeline.c.event_id))))
        assert rows == distinct == len(stored) == last, "projection rows match stream messages"
    finally:
        publisher.cancel()
        runtime.stop()
        for p in (projector, *others):
            p.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
        with contextlib.suppress(Exception):
            await nc.close()
        await engine.dispose()
        server.stop()


async def test_a_handler_starting_while_the_server_does_not_answer_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A loaded or electing cluster can leave a JetStream API request unanswered past its
    timeout; a handler's start asks again instead of exiting (it did, in a 3-node CI run)."""
    server = EmbeddedServer(tmp_path / "data", port=free_port())
    url = server.start()
    cfg = BusConfig(url=url, data_dir=tmp_path, root="paused", append_timeout_s=0.5)
    nc = await connect(url, name="paused-test")
    log = await EventLog.open(nc, cfg)
    runtime = HandlerRuntime(log, EchoReactor(), options=FAST)
    caplog.set_level(logging.INFO, logger="nanocrab.bus.connection")
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        starting = asyncio.create_task(runtime.ensure_consumer())
        await eventually(lambda: "asking again" in caplog.text or starting.done())
        assert not starting.done(), "the start waited for the paused server"
    finally:
        os.kill(server.pid, signal.SIGCONT)
    try:
        await asyncio.wait_for(starting, 30)
        info = await log.js.consumer_info(cfg.log_stream, runtime.durable)
        assert info.config.durable_name == runtime.durable
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
        server.stop()
