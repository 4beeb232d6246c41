"""One event log per identity: how a process talks to a bus that enforces broker permissions.

With broker permissions on (DESIGN §8) each part of a process — every handler, the projectors,
the person at the CLI — connects as its own NATS user, so the server checks every publish against
that identity's row in :mod:`nanocrab.bus.permissions`. With them off, every identity shares one
plain connection, exactly as before: the caller's code is the same either way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

import nats.errors
from nats.aio.client import Client as NATS

from nanocrab.bus.artifacts import ensure_bucket
from nanocrab.bus.config import BusConfig
from nanocrab.bus.connection import connect, ensure_streams
from nanocrab.bus.errors import BusError
from nanocrab.bus.log import EventLog
from nanocrab.bus.permissions import ADMIN

SeedSource = Callable[[str], bytes]
"""Maps an identity name to its nkey seed (``SU…``); raises :class:`BusError` when it has none."""


class Connector:
    """Opens and caches an :class:`EventLog` per identity on the server at ``url``.

    ``seeds`` turns broker permissions on: each identity gets its own connection authenticated
    with its seed. Without ``seeds`` every identity gets the same log on one connection.
    :meth:`open` connects (async); :meth:`log_for` hands out an already opened log (sync, for
    wiring code such as ``build_reactors(..., log_for=...)``).
    """

    def __init__(
        self,
        url: str,
        cfg: BusConfig,
        *,
        seeds: SeedSource | None = None,
        name: str = "nanocrab",
    ) -> None:
        self.url = url
        self.cfg = cfg
        self.seeds = seeds
        self.name = name
        self._logs: dict[str, EventLog] = {}
        self._shared: EventLog | None = None
        self._lock = asyncio.Lock()

    @property
    def auth(self) -> bool:
        """Whether each identity authenticates on its own connection."""
        return self.seeds is not None

    async def _connect(self, identity: str) -> NATS:
        if self.seeds is None:
            return await connect(self.url, name=self.name)
        return await connect(
            self.url,
            name=f"{self.name}/{identity}",
            nkey_seed=self.seeds(identity),
            identity=identity,
        )

    async def open(self, identity: str) -> EventLog:
        """The log that publishes as ``identity``, connecting on first use."""
        async with self._lock:
            log = self._logs.get(identity)
            if log is not None:
                return log
            if not self.auth:
                if self._shared is None:
                    self._shared = EventLog(await self._connect(identity), self.cfg)
                log = self._shared
            else:
                log = EventLog(await self._connect(identity), self.cfg)
            self._logs[identity] = log
            return log

    async def open_all(self, identities: Iterable[str]) -> Callable[[str], EventLog]:
        """Open a log for each of ``identities``; returns :meth:`log_for`."""
        for identity in identities:
            await self.open(identity)
        return self.log_for

    def log_for(self, identity: str) -> EventLog:
        """The already opened log of ``identity`` (any identity's, with permissions off)."""
        log = self._logs.get(identity)
        if log is None and not self.auth and self._shared is not None:
            return self._shared
        if log is None:
            opened = ", ".join(sorted(self._logs)) or "none"
            raise BusError(
                f"no connection as {identity!r} is open (opened: {opened}); open it first with "
                f"`await connector.open({identity!r})` — every handler needs its own NATS "
                "identity when broker permissions are on (nanocrab.bus.permissions)"
            )
        return log

    async def setup(self) -> None:
        """Create or bring up to date the streams and the artifact bucket, as ``admin``.

        With permissions on, the admin connection is used for this and closed again: nothing
        else in the process runs with its rights.
        """
        if not self.auth:
            log = await self.open(ADMIN)
            await ensure_streams(log.js, self.cfg)
            await ensure_bucket(log.js, self.cfg)
            return
        nc = await self._connect(ADMIN)
        try:
            js = nc.jetstream(timeout=self.cfg.append_timeout_s)
            await ensure_streams(js, self.cfg)
            await ensure_bucket(js, self.cfg)
        finally:
            with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
                await nc.drain()

    async def close(self) -> None:
        """Drain every connection this connector opened."""
        connections = {id(log.nc): log.nc for log in self._logs.values()}
        self._logs.clear()
        self._shared = None
        for nc in connections.values():
            with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
                await nc.drain()
