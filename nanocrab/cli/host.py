"""Wires a process: the server (embedded or external), the logs, handlers and projectors.

With broker permissions on (the default for the embedded server, docs/security.md) a process
connects once per identity: commands publish as ``cli`` (or ``approver``), each handler as
itself, projectors as ``projector``, and stream set-up runs briefly as ``admin``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nats.js.errors import NotFoundError
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import (
    BusConfig,
    BusError,
    Connector,
    EmbeddedServer,
    EventLog,
    HandlerRuntime,
    Reactor,
    RuntimeOptions,
)
from nanocrab.bus.connection import stream_info
from nanocrab.bus.connector import SeedSource
from nanocrab.bus.permissions import (
    ADMIN,
    CLI,
    IDENTITIES,
    PROJECTOR,
    RUNTIME_IDENTITIES,
    auth_config,
)
from nanocrab.bus.supervisor import Supervised, supervise
from nanocrab.cli.observers import observer_keys
from nanocrab.projections import (
    Projection,
    ProjectionError,
    ProjectionWorker,
    Projector,
    all_projections,
    make_engine,
    reopenable,
)
from nanocrab.projections.feed import SharedFeed
from nanocrab.projections.spec import BusSpec
from nanocrab.projections.worker import Mode
from nanocrab.security import KeyRing, SecurityError

log = logging.getLogger(__name__)

LogFor = Callable[[str], EventLog]
"""An identity's log: ``log_for("executor")``."""


@dataclass(frozen=True)
class BusSession:
    """What :func:`bus_connector` yields: this command's log, the embedded server (``None`` for
    an external one), and the connector that opens a log for any other identity."""

    log: EventLog
    server: EmbeddedServer | None
    connector: Connector

    async def open(self, identity: str) -> EventLog:
        """A log publishing as ``identity`` (e.g. ``"approver"`` for an approval prompt)."""
        return await self.connector.open(identity)

    async def open_runtime(self) -> LogFor:
        """Connect every handler identity and the projectors; returns the ``log_for`` that
        ``build_reactors`` and :class:`Host` take."""
        return await self.connector.open_all(RUNTIME_IDENTITIES)


def public_keys(keyring: KeyRing) -> dict[str, str]:
    """Every identity's public nkey, creating missing seeds (the embedded server's users)."""
    try:
        return {name: keyring.public_key(name) for name in IDENTITIES}
    except SecurityError as exc:
        raise BusError(str(exc)) from exc


def server_authorization(keyring: KeyRing, cfg: BusConfig) -> str:
    """The ``authorization`` block for this data dir: every identity (creating missing seeds)
    and every observer (``nanocrab security observer``)."""
    return auth_config(public_keys(keyring), cfg, observers=observer_keys(keyring.dir))


def seed_source(keyring: KeyRing, *, create: bool) -> SeedSource:
    """Seeds from ``keyring``; ``create=False`` (an external cluster, whose server config lists
    existing keys) refuses to invent one."""

    def seed(identity: str) -> bytes:
        if not create and not keyring.exists(identity):
            raise BusError(
                f"no nkey seed for identity {identity!r} in {keyring.dir}: copy {identity}.nk "
                "there from the data dir whose public keys the cluster's config lists "
                "(`nanocrab security nats-config` there), or set NANOCRAB_NATS_AUTH=none"
            )
        try:
            return keyring.seed(identity)
        except SecurityError as exc:
            raise BusError(str(exc)) from exc

    return seed


@contextlib.asynccontextmanager
async def bus_connector(
    cfg: BusConfig, *, name: str = "nanocrab-cli", sync: str = "default", identity: str = CLI
) -> AsyncIterator[BusSession]:
    """Connect to ``cfg.url``, or to the data dir's embedded server (started if not running and
    stopped on exit only if this session started it), as ``identity``.

    Sets the streams and the artifact bucket up as ``admin`` first — on an external cluster only
    where the admin seed is present; elsewhere they must exist already.
    """
    keyring = KeyRing(cfg.keys_dir) if cfg.authenticated else None
    server: EmbeddedServer | None = None
    url = cfg.url
    if url is None:
        authorization = server_authorization(keyring, cfg) if keyring is not None else ""
        server = EmbeddedServer(cfg.data_dir, sync_interval=sync, authorization=authorization)
        url = await asyncio.to_thread(server.start)
    seeds = seed_source(keyring, create=cfg.url is None) if keyring is not None else None
    connector = Connector(url, cfg, seeds=seeds, name=name)
    try:
        admin_here = keyring is None or cfg.url is None or keyring.exists(ADMIN)
        if admin_here:
            await connector.setup()
        own = await connector.open(identity)
        if not admin_here:
            await _require_streams(own, url)
        yield BusSession(own, server, connector)
    finally:
        await connector.close()
        if server is not None:
            # not waiting for its JetStream shutdown: the next start waits, if it comes first
            await asyncio.to_thread(server.stop, wait=False)


async def _require_streams(log_: EventLog, url: str) -> None:
    try:
        await stream_info(log_.js, log_.cfg.log_stream)  # waits out a leader election
    except NotFoundError as exc:
        raise BusError(
            f"stream {log_.cfg.log_stream} does not exist on {url}: set the "
            f"bus up once with the admin identity (any nanocrab command where "
            f"{log_.cfg.keys_dir / 'admin.nk'} holds the admin seed)"
        ) from exc


@contextlib.asynccontextmanager
async def bus_session(
    cfg: BusConfig, *, name: str = "nanocrab-cli", sync: str = "default", identity: str = CLI
) -> AsyncIterator[tuple[EventLog, EmbeddedServer | None]]:
    """:func:`bus_connector` for commands that need one log: yields ``(log, server)``, the log
    publishing as ``identity`` (``cli`` by default; ``approver`` for approval answers)."""
    async with bus_connector(cfg, name=name, sync=sync, identity=identity) as session:
        yield session.log, session.server


@dataclass
class Host:
    """Runs reactors and projectors as tasks until ``stop()``.

    ``log_for`` gives each handler runtime the log of its reactor's identity (``reactor.name``:
    its consumer, acks and dead letters go through it) and the projectors the ``projector`` one;
    without it everything runs on ``log``.
    """

    log: EventLog
    engine: AsyncEngine
    reactors: Sequence[Reactor]
    projections: Sequence[Projection] = field(default_factory=all_projections)
    options: RuntimeOptions = field(default_factory=RuntimeOptions)
    log_for: LogFor | None = None
    projectors_in: Mode | None = "thread"
    """Where projectors run: a worker thread with its own loop, a child process, or (``None``,
    and for an in-memory database) the handlers' own loop (projections/worker.py)."""
    runtimes: list[HandlerRuntime] = field(default_factory=list, init=False)
    projectors: list[Projector] = field(default_factory=list, init=False)
    """Every projector, for observation (``position``, ``failure``); a process worker's are
    not among them."""
    worker: ProjectionWorker | None = field(default=None, init=False)
    _in_loop: list[Projector] = field(default_factory=list, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    _background: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    supervised: list[Supervised] = field(default_factory=list, init=False)
    """Each background loop's restarts and last crash."""

    async def start(self) -> None:
        logs = self.log_for or (lambda _identity: self.log)
        self.runtimes = [
            HandlerRuntime(
                logs(r.name),
                r,
                options=dataclasses.replace(
                    self.options, concurrency=getattr(r, "concurrency", self.options.concurrency)
                ),
            )
            for r in self.reactors
        ]
        url = reopenable(self.engine)
        in_loop = list(self.projections)
        if in_loop and url is not None and self.projectors_in is not None:
            spec = BusSpec.of(logs(PROJECTOR), PROJECTOR)
            self.worker = ProjectionWorker(spec, url, in_loop, mode=self.projectors_in)
            await self.worker.start()
            in_loop = []
        feed = SharedFeed(logs(PROJECTOR)) if in_loop else None
        self._in_loop = [Projector(logs(PROJECTOR), self.engine, p, feed=feed) for p in in_loop]
        for p in self._in_loop:
            await p.setup()
        self.projectors = [*(self.worker.projectors if self.worker else []), *self._in_loop]
        for rt in self.runtimes:
            await rt.ensure_consumer()
        self._tasks = [
            *(asyncio.create_task(rt.run(), name=f"handler:{rt.durable}") for rt in self.runtimes),
            *(asyncio.create_task(p.run(), name=f"projector:{p.name}") for p in self._in_loop),
        ]
        # Everything alive now (imported modules, the SDKs, compiled schemas) lives as long as the
        # process: keep it out of full collections, which otherwise stall the loop ~100+ ms.
        gc.freeze()
        # each reactor's background loop restarts after a crash (bus/supervisor.py)
        self.supervised = [Supervised(r.name) for r in self.reactors if hasattr(r, "background")]
        loops = [r.background for r in self.reactors if hasattr(r, "background")]
        self._background = [
            asyncio.create_task(supervise(item, loop), name=f"background:{item.name}")
            for item, loop in zip(self.supervised, loops, strict=True)
        ]

    async def stop(self, *, drain_s: float = 10.0) -> None:
        """Stop handlers (each finishes the event in hand), then bring every projection up to
        the end of the log (bounded by ``drain_s``) so read models are current on exit."""
        for task in self._background:
            task.cancel()
        for rt in self.runtimes:
            rt.stop()
        for p in self._in_loop:
            p.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.worker is not None:
            await self.worker.stop(drain_s=drain_s)
            self.worker = None
        for p in self._in_loop:
            try:
                await asyncio.wait_for(p.catch_up(), drain_s)
            except (TimeoutError, BusError, ProjectionError) as exc:
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
