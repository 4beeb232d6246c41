"""Wires a process: the server (embedded or external), the log, handlers and projectors."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client as NATS
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import (
    BusConfig,
    BusError,
    EmbeddedServer,
    EventLog,
    HandlerRuntime,
    Reactor,
    RuntimeOptions,
    connect,
)
from nanocrab.projections import Projection, Projector, all_projections, make_engine

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def bus_session(
    cfg: BusConfig, *, name: str = "nanocrab-cli", sync: str = "default"
) -> AsyncIterator[tuple[EventLog, EmbeddedServer | None]]:
    """Connect to ``cfg.url``, or to the data dir's embedded server (started if not running and
    stopped on exit only if this session started it)."""
    server: EmbeddedServer | None = None
    url = cfg.url
    if url is None:
        server = EmbeddedServer(cfg.data_dir, sync_interval=sync)
        url = await asyncio.to_thread(server.start)
    nc: NATS | None = None
    try:
        nc = await connect(url, name=name)
        yield await EventLog.open(nc, cfg), server
    finally:
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.drain()
        if server is not None:
            await asyncio.to_thread(server.stop)


@dataclass
class Host:
    """Runs reactors and projectors as tasks on one connection until ``stop()``."""

    log: EventLog
    engine: AsyncEngine
    reactors: Sequence[Reactor]
    projections: Sequence[Projection] = field(default_factory=all_projections)
    options: RuntimeOptions = field(default_factory=RuntimeOptions)
    runtimes: list[HandlerRuntime] = field(default_factory=list, init=False)
    projectors: list[Projector] = field(default_factory=list, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    _background: list[asyncio.Task[None]] = field(default_factory=list, init=False)

    async def start(self) -> None:
        self.runtimes = [
            HandlerRuntime(
                self.log,
                r,
                options=dataclasses.replace(
                    self.options, concurrency=getattr(r, "concurrency", self.options.concurrency)
                ),
            )
            for r in self.reactors
        ]
        self.projectors = [Projector(self.log, self.engine, p) for p in self.projections]
        for p in self.projectors:
            await p.setup()
        for rt in self.runtimes:
            await rt.ensure_consumer()
        self._tasks = [
            *(asyncio.create_task(rt.run(), name=f"handler:{rt.durable}") for rt in self.runtimes),
            *(asyncio.create_task(p.run(), name=f"projector:{p.name}") for p in self.projectors),
        ]
        # Everything alive now (imported modules, the SDKs, compiled schemas) lives as long as the
        # process: keep it out of full collections, which otherwise stall the loop ~100+ ms.
        gc.freeze()
        self._background = [
            asyncio.create_task(r.background(), name=f"background:{r.name}")  # type: ignore[attr-defined]
            for r in self.reactors
            if hasattr(r, "background")
        ]

    async def stop(self, *, drain_s: float = 10.0) -> None:
        """Stop handlers (each finishes the event in hand), then bring every projection up to
        the end of the log (bounded by ``drain_s``) so read models are current on exit."""
        for task in self._background:
            task.cancel()
        for rt in self.runtimes:
            rt.stop()
        for p in self.projectors:
            p.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for p in self.projectors:
            try:
                await asyncio.wait_for(p.catch_up(), drain_s)
            except (TimeoutError, BusError) as exc:
                log.warning("projection %s not fully caught up on exit: %r", p.name, exc)


class RuntimeMarker:
    """``<home>/runtime.json`` says a ``nanocrab up`` (with handlers) is serving this data dir."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / "runtime.json"

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"pid": os.getpid()}))

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if json.loads(self.path.read_text()).get("pid") == os.getpid():
                self.path.unlink()

    def alive(self) -> bool:
        try:
            pid = int(json.loads(self.path.read_text())["pid"])
            os.kill(pid, 0)
        except (FileNotFoundError, ValueError, KeyError, ProcessLookupError, json.JSONDecodeError):
            return False
        except PermissionError:
            return True
        return True


def engine_for(db_url: str) -> AsyncEngine:
    return make_engine(db_url)
