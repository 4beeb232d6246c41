"""The versioned configuration view: what every handler reads its configuration through.

One :class:`ConfigView` per process. It knows every switch of the log — ``reload.activated``
and ``reload.rolled_back``, stored on one subject filter (``…system.config.reload.*``) — from a
batched direct read at start and an ordered consumer after that, and holds each version it has
loaded (snapshot from the object store, materialized once under ``cache_dir/<version>``, never
modified afterwards).

Which version a run uses is decided once, from the log, and pinned: the orchestrator asks
:meth:`ConfigView.version_at` for the stream sequence of the event that starts the run — the
version of the last switch stored before it — and writes it into ``run.started.config``. Every
other handler reads the run's pin from the run's state (already in memory) and asks
:meth:`ConfigView.get`, a dict lookup; so all instances of all handlers agree, a run in flight
finishes on its version, and no event costs a bus round trip for the lookup. ``version_at`` is
exact: when the view has not yet seen the log up to that sequence it reads the switch subject
once (concurrent callers share the read), which happens once per run start at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
from bisect import bisect_left
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec
import nats.errors

from nanocrab.agents import register_profiles
from nanocrab.bus import EventLog
from nanocrab.bus.direct import DirectReader
from nanocrab.bus.errors import BusError, TransientError
from nanocrab.bus.permissions import artifact_bucket
from nanocrab.bus.replay import Window, read
from nanocrab.events import (
    ArtifactRef,
    EventDecodeError,
    ReloadActivated,
    ReloadRolledBack,
)
from nanocrab.events.system import SWITCH_SUBJECT_ID
from nanocrab.reload.loaded import BaseConfig, LoadedConfig, load_config
from nanocrab.reload.snapshot import Snapshot
from nanocrab.routing import agent_profiles, install_profiles

log = logging.getLogger(__name__)

SNAPSHOT_NAME = "config.msgpack"

_pinned: ContextVar[str | None] = ContextVar("nanocrab_config_version", default=None)


def pinned_version() -> str | None:
    """The configuration version of the run being handled in this context (``None``: none
    pinned, use the active one)."""
    return _pinned.get()


@contextlib.contextmanager
def pinned(version: str) -> Iterator[None]:
    """Within the block, versioned readers (:class:`~nanocrab.reload.skills.VersionedSkills`)
    serve ``version``: a handler wraps the work it does for one run in it."""
    token = _pinned.set(version)
    try:
        yield
    finally:
        _pinned.reset(token)


def snapshot_ref(bucket: str, version: str, size: int = 0) -> ArtifactRef:
    """Where a version's snapshot is stored: content-addressed, ``<version>/config.msgpack``."""
    return ArtifactRef(
        bucket=bucket, key=f"{version}/{SNAPSHOT_NAME}", size=size, sha256=version,
        media_type="application/msgpack",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Switch:
    """A switch of the log: from stream sequence ``seq`` on, new runs use ``version``."""

    seq: int
    version: str
    time: datetime
    event: ReloadActivated | ReloadRolledBack


class ConfigView:
    """Configuration versions by id, and the switches of the log.

    ``startup`` is version ``""``: the configuration the process loaded at start (files, or
    bundled defaults), used before the first switch and by runs pinned to nothing.
    """

    def __init__(
        self,
        startup: LoadedConfig,
        *,
        base: BaseConfig,
        cache_dir: Path,
        log: EventLog | None = None,
    ) -> None:
        """``log``: where the switches are read (any identity: it only reads); the view starts
        on first use (:meth:`ready`). Without one, only the start-up version exists."""
        self.base = base
        self.cache_dir = cache_dir
        self.versions: dict[str, LoadedConfig] = {"": startup}
        self.switches: list[Switch] = []
        self._seqs: list[int] = []
        self.confirmed = 0
        """Every switch stored before this stream sequence is in :attr:`switches`."""
        self._wanted = 0
        self._lock = asyncio.Lock()
        self._loading: dict[str, asyncio.Future[LoadedConfig]] = {}
        self._log: EventLog | None = log
        self._reader: DirectReader | None = None
        self._follow: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()
        """Set (and replaced) whenever the active version changes: tests and the bench wait
        on it."""

    # -- reading ----------------------------------------------------------------------------

    @property
    def active(self) -> str:
        """The version new runs use now, as far as this process has seen."""
        return self.switches[-1].version if self.switches else ""

    @property
    def current(self) -> LoadedConfig:
        return self.versions.get(self.active, self.versions[""])

    def get(self, version: str | None) -> LoadedConfig:
        """Version ``version`` (``None``: the active one), loaded. A version this process has
        not loaded yet raises ``KeyError``: :meth:`ensure` it first (handlers do, per run)."""
        return self.current if version is None else self.versions[version]

    def pinned(self) -> LoadedConfig:
        """The version pinned in this context (:func:`pinned`), else the active one."""
        version = _pinned.get()
        if version is None:
            return self.current
        return self.versions.get(version) or self.current

    async def ensure(self, version: str) -> LoadedConfig:
        """Version ``version``, loading it from the object store on first use."""
        found = self.versions.get(version)
        if found is not None:
            return found
        await self.ready()
        pending = self._loading.get(version)
        if pending is None:
            pending = asyncio.ensure_future(self._load(version))
            self._loading[version] = pending
            pending.add_done_callback(lambda _f: self._loading.pop(version, None))
        return await asyncio.shield(pending)

    def _at(self, seq: int) -> str:
        i = bisect_left(self._seqs, seq)  # switches stored strictly before ``seq``
        return self.switches[i - 1].version if i > 0 else ""

    async def version_at(self, seq: int) -> str:
        """The version of the last switch stored before stream sequence ``seq`` (``""``: none):
        what a run started by the event at ``seq`` pins. Exact on every instance."""
        await self.ready()
        if seq > self.confirmed and self._reader is not None:
            self._wanted = max(self._wanted, seq)
            async with self._lock:
                if seq > self.confirmed:
                    target = self._wanted
                    await self._catch_up()
                    self.confirmed = max(self.confirmed, target)
        version = self._at(seq)
        await self.ensure(version)
        return version

    async def latest(self) -> tuple[int, str]:
        """The last switch of the log now (its stream sequence, 0 for none) and the active
        version, read from the server (one round trip): what a new switch must follow."""
        await self.ready()
        if self._reader is not None:
            async with self._lock:
                await self._catch_up()
        return (self._seqs[-1] if self._seqs else 0), self.active

    # -- feeding ----------------------------------------------------------------------------

    async def ready(self) -> None:
        """Start once: read every switch of the log (so a restart comes back on the active
        version, its snapshot loaded), then follow new ones in the background."""
        if self._reader is not None or self._log is None:
            return  # started, or starting (its catch-up loads versions through ensure)
        async with self._lock:
            if self._reader is not None:
                return
            self._reader = DirectReader(
                self._log.nc, self._log.cfg.log_stream, leader_only=not self._log.direct
            )
            await self._catch_up()
        if self.switches:
            await self.ensure(self.active)
        self._follow = asyncio.create_task(self._follow_log(), name="config-view")

    async def start(self, log_: EventLog) -> None:
        """Bind to ``log_`` and :meth:`ready`."""
        self._log = log_
        await self.ready()

    async def stop(self) -> None:
        """Stop following the log (at shutdown). ``version_at``, ``latest`` and ``ensure``
        stay exact: they read the log themselves when the view has not seen far enough."""
        if self._follow is not None:
            self._follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follow
            self._follow = None

    @property
    def scope(self) -> str:
        assert self._log is not None
        return f"{self._log.cfg.root}.*.system.{SWITCH_SUBJECT_ID}.reload.*"

    async def _catch_up(self) -> None:
        assert self._log is not None and self._reader is not None
        after = self._seqs[-1] if self._seqs else 0
        for raw in await self._reader.after(self.scope, after):
            try:
                event = self._log.decode(raw.data, subject=raw.subject)
            except EventDecodeError as exc:
                log.warning("config view: skipping stored message %d: %s", raw.seq, exc)
                continue
            await self._apply(raw.seq, event)

    async def _follow_log(self) -> None:
        assert self._log is not None
        while True:
            start = (self._seqs[-1] + 1) if self._seqs else 1
            try:
                async for stored in read(
                    self._log, self.scope, Window(start_seq=start), follow=True
                ):
                    if stored.event is not None:
                        await self._apply(stored.seq, stored.event)
            except (BusError, OSError, TimeoutError) as exc:
                log.warning("config view: following switches failed (%r); again in 1 s", exc)
            await asyncio.sleep(1.0)

    async def _apply(self, seq: int, event: object) -> None:
        if not isinstance(event, ReloadActivated | ReloadRolledBack):
            return
        if seq in self._seqs:
            return
        try:
            await self.ensure(event.version)
        except TransientError as exc:
            # recorded anyway: runs pinned to it wait (their handlers retry) until it loads
            log.error("config view: version %s not loadable yet: %s", event.version[:12], exc)
        i = bisect_left(self._seqs, seq)
        self._seqs.insert(i, seq)
        self.switches.insert(i, Switch(seq, event.version, event.time, event))
        if i == len(self.switches) - 1:
            self.changed.set()
            self.changed = asyncio.Event()

    async def _load(self, version: str) -> LoadedConfig:
        root = self.cache_dir / version
        if not (root / ".complete").exists():
            snapshot = await self._fetch(version)
            if snapshot.version != version:
                raise TransientError(f"snapshot {version[:12]} does not hash to its version")
            tmp = self.cache_dir / f".{version}.{os.getpid()}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            await asyncio.to_thread(snapshot.materialize, tmp)
            (tmp / ".complete").write_text(version)
            try:
                tmp.rename(root)
            except OSError:  # another process materialized it first: same bytes
                shutil.rmtree(tmp, ignore_errors=True)
        loaded = await asyncio.to_thread(load_config, version, root, self.base)
        self.versions[version] = loaded
        _new_agents(loaded)
        return loaded

    async def _fetch(self, version: str) -> Snapshot:
        if self._log is None:
            raise TransientError(f"version {version[:12]} is unknown and there is no bus")
        from nanocrab.bus.artifacts import JetStreamArtifacts

        store = JetStreamArtifacts(self._log)
        try:
            data = await store.get(snapshot_ref(artifact_bucket(self._log.cfg), version))
        except (nats.errors.Error, OSError, msgspec.DecodeError) as exc:
            raise TransientError(f"cannot fetch config version {version[:12]}: {exc!r}") from exc
        return Snapshot.decode(data)

    def remember(self, snapshot: Snapshot, loaded: LoadedConfig | None = None) -> None:
        """Keep a version this process built itself (the reloader), skipping the fetch."""
        root = self.cache_dir / snapshot.version
        if not (root / ".complete").exists():
            snapshot.materialize(root)
            (root / ".complete").write_text(snapshot.version)
        if loaded is None:
            loaded = load_config(snapshot.version, root, self.base)
        self.versions.setdefault(snapshot.version, loaded)
        _new_agents(loaded)


def _new_agents(loaded: LoadedConfig) -> None:
    """The version's agent profiles become known: its own table, for the runs pinned to it
    (:func:`nanocrab.agents.profiles_for`); and the agents this process has no start-up
    profile for join the start-up table (a Python agent added by a reload is routed to and
    started as itself, not as ``default``, by what reads no version), existing ones unchanged."""
    if loaded.agents is not None:
        register_profiles(loaded.version, functools.partial(agent_profiles, loaded.agents))
        install_profiles(loaded.agents, only_new=True)
