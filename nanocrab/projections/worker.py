"""Runs projectors off the caller's event loop: in a thread with its own loop, or in a process.

Projectors that share the handlers' loop cost every agent run their NATS deliveries, decodes and
database round trips (docs/architecture.md). A :class:`ProjectionWorker` gives them a NATS
connection (as the ``projector`` identity) and a database engine of their own, in a thread with
its own event loop (``mode="thread"``) or in a child process (``mode="process"``, which also
frees the handlers' interpreter of them: no GIL shared). The projectors follow the log through
one shared subscription (``feed.py``: each event delivered and decoded once, not once per
projection). Nothing else changes: each projector
still applies one batch per transaction together with its checkpoint, records and logs
:class:`ProjectionFailed`, retries with backoff and re-subscribes after a server restart, and
``nanocrab status`` still reads the checkpoints and failures from the database.

``start`` returns once every projection's tables exist (a set-up failure is raised there);
``stop`` brings every projection up to the end of the log (bounded by ``drain_s``) and waits
for the worker to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Literal, Protocol

import nats.errors
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import BusError, EventLog, connect
from nanocrab.projections.base import Projection, ProjectionError
from nanocrab.projections.db import make_engine
from nanocrab.projections.feed import SharedFeed
from nanocrab.projections.projector import Projector
from nanocrab.projections.spec import BusSpec

log = logging.getLogger(__name__)

Mode = Literal["thread", "process"]

LIVE_COMMIT_INTERVAL_S = 0.25
"""While the log is busy, a projection in the worker commits at most this often (an event after
a quiet spell is still applied at once). Each commit is a transaction with its checkpoint per
projection; at the projector's default 50 ms the eight bundled projections committed about once
per run each, the worker's largest cost (bench/agent_latency.py: 12-14 -> 7-8 ms of CPU per run,
docs/architecture.md). A projection that something decides on keeps a shorter interval of its
own (``commit_interval_s``: the usage projection, read for shared budget caps)."""


WORKER_NICE = 10
"""How much the worker process lowers its own scheduling priority. Its read models may trail a
busy log (above); the handlers' process, its embedding thread and nats-server may not: on two
cores, at equal priority, the worker's bursts took CPU from the run in flight (one-tool run,
three interleaved pairs: mean 24.9 / 21.6 / 22.4 -> 22.1 / 20.5 / 20.0 ms, p99 36.6 / 30.0 /
31.0 -> 29.8 / 25.9 / 27.1 ms; 100 in flight 73.5 / 79.1 -> 86.9 / 83.3 runs/s). An idle core
is still the worker's: the level only orders who waits when both want one."""


def _commit_interval(projection: Projection) -> float:
    return float(getattr(projection, "commit_interval_s", LIVE_COMMIT_INTERVAL_S))


class _Stop(Protocol):
    def set(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class ProjectionWorker:
    """Runs one :class:`Projector` per projection on a connection and engine of its own.

    In ``thread`` mode ``projectors`` are the live objects (their ``position``, ``failure``
    may be read from any thread); in ``process`` mode they live in the child and the list is
    empty: the database is where to look.
    """

    def __init__(
        self,
        bus: BusSpec,
        db_url: str,
        projections: Sequence[Projection],
        *,
        mode: Mode = "thread",
        drain_s: float = 10.0,
    ) -> None:
        self.bus = bus
        self.db_url = db_url
        self.projections = list(projections)
        self.mode: Mode = mode
        self.drain_s = drain_s
        self.projectors: list[Projector] = []
        self._stop: _Stop | None = None
        self._thread: threading.Thread | None = None
        self._process: multiprocessing.process.BaseProcess | None = None

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.projections]

    @property
    def pid(self) -> int | None:
        """The worker process's id (``None`` in thread mode, or when not running)."""
        return self._process.pid if self._process is not None else None

    async def start(self, timeout_s: float = 60.0) -> None:
        """Start the worker and return once every projection is set up; raise
        :class:`ProjectionError` when one cannot be (the worker is stopped again)."""
        ctx = multiprocessing.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        if self.mode == "thread":
            stop: _Stop = threading.Event()
            self._thread = threading.Thread(
                target=_serve, name="projections", daemon=True,
                args=(self.bus, self.db_url, self.projections, self.drain_s, stop, send, self),
            )  # fmt: skip
            self._thread.start()
        else:
            stop = ctx.Event()
            self._process = ctx.Process(
                target=_serve, name="nanocrab-projections", daemon=True,
                args=(self.bus, self.db_url, self.projections, self.drain_s, stop, send, None,
                      logging.getLogger().getEffectiveLevel()),
            )  # fmt: skip
            self._process.start()
            send.close()
        self._stop = stop
        try:
            message = await asyncio.to_thread(_receive, receive, timeout_s)
        finally:
            receive.close()
        if message != "ready":
            await self.stop(drain_s=0)
            raise ProjectionError(f"the projection worker did not start: {message}")

    async def stop(self, *, drain_s: float | None = None) -> None:
        """Stop following the log, catch every projection up (bounded by ``drain_s``, default
        the worker's) and wait for the worker to end."""
        if self._stop is None:
            return
        if drain_s is not None:
            self.drain_s = drain_s  # read by the thread when it drains; sent with nothing else
        self._stop.set()
        self._stop = None
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self._process is not None:
            process = self._process
            await asyncio.to_thread(process.join, self.drain_s + 10.0)
            if process.is_alive():
                log.warning("projection worker did not end in time; killing it")
                process.kill()  # it ignores SIGTERM (see _serve)
                await asyncio.to_thread(process.join, 5.0)
            self._process = None


def _receive(conn: Connection, timeout_s: float) -> str:
    if not conn.poll(timeout_s):
        return f"no answer within {timeout_s:.0f}s"
    try:
        return str(conn.recv())
    except EOFError:
        return "it ended before it was ready"


def _serve(
    bus: BusSpec,
    db_url: str,
    projections: Sequence[Projection],
    drain_s: float,
    stop: _Stop,
    ready: Connection,
    owner: ProjectionWorker | None,
    log_level: int | None = None,
) -> None:
    """The worker's body (a thread's target, or a child process's)."""
    parent = None
    if log_level is not None:  # in a child process
        # Ctrl-C and SIGTERM reach the whole process group: the parent decides when to stop
        # (then the child catches up before it ends), or the child notices the parent is gone
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        parent = os.getppid()
        with contextlib.suppress(AttributeError, OSError):  # no os.nice on Windows
            os.nice(WORKER_NICE)
        # a spawned process starts without the parent's logging set-up
        logging.basicConfig(
            level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    try:
        asyncio.run(_main(bus, db_url, projections, drain_s, stop, ready, owner, parent))
    finally:
        ready.close()


async def _main(
    bus: BusSpec,
    db_url: str,
    projections: Sequence[Projection],
    drain_s: float,
    stop: _Stop,
    ready: Connection,
    owner: ProjectionWorker | None,
    parent: int | None,
) -> None:
    try:
        nc = await connect(
            bus.url,
            name=f"nanocrab-projections/{bus.identity}",
            nkey_seed=bus.seed.encode() if bus.seed else None,
            identity=bus.identity,
        )
    except BusError as exc:
        ready.send(str(exc))
        return
    engine: AsyncEngine | None = None
    try:
        try:
            engine = make_engine(db_url)
            log_ = EventLog(nc, bus.cfg)
            feed = SharedFeed(log_)  # each event delivered and decoded once for all of them
            projectors = [
                Projector(log_, engine, p, feed=feed, commit_interval_s=_commit_interval(p))
                for p in projections
            ]
            for p in projectors:
                await p.setup()
        except Exception as exc:  # reported to start(), which raises it in the caller
            ready.send(f"{type(exc).__name__}: {exc}")
            return
        if owner is not None:
            owner.projectors = projectors
        ready.send("ready")
        tasks = [asyncio.create_task(p.run(), name=f"projector:{p.name}") for p in projectors]
        await asyncio.to_thread(_wait, stop, parent)
        for p in projectors:
            p.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await feed.close()
        if owner is not None:
            drain_s = owner.drain_s
        for p in projectors:
            try:
                await asyncio.wait_for(p.catch_up(), drain_s)
            except (TimeoutError, BusError, ProjectionError) as exc:
                log.warning("projection %s not fully caught up on exit: %r", p.name, exc)
    finally:
        if engine is not None:
            await engine.dispose()
        with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
            await nc.drain()


def _wait(stop: _Stop, parent: int | None) -> None:
    """Until ``stop`` is set, or (in a child process) the parent process is gone."""
    while not stop.wait(1.0):
        if parent is not None and os.getppid() != parent:
            log.warning("projection worker: the process that started it is gone; stopping")
            return
