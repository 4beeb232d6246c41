"""Connecting to NATS and preparing the streams."""

from __future__ import annotations

import asyncio
import logging

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from nanocrab.bus.config import BusConfig
from nanocrab.bus.errors import BusError

log = logging.getLogger(__name__)


class Reconnects:
    """Counts (re)connections so long-lived subscriptions know when to re-create themselves.

    nats-py re-subscribes plain subscriptions after a reconnect, but pull requests in flight and
    ordered consumers' server-side state can be gone (nats.py issue #504), so the runtimes compare
    ``generation`` before and after each wait and rebuild their subscription when it changed.
    """

    def __init__(self) -> None:
        self.generation = 0
        self.connected = asyncio.Event()
        self.connected.set()

    async def on_disconnect(self) -> None:
        self.connected.clear()

    async def on_reconnect(self) -> None:
        self.generation += 1
        self.connected.set()


async def connect(
    url: str,
    *,
    name: str = "nanocrab",
    user: str | None = None,
    password: str | None = None,
    connect_timeout: float = 5.0,
) -> NATS:
    """A client that reconnects forever, quickly: handlers ride out a server restart."""
    reconnects = Reconnects()

    async def error_cb(exc: Exception) -> None:
        log.debug("nats %s: %r", name, exc)

    try:
        # The deadline bounds the *first* connection: with unlimited reconnects nats-py would
        # otherwise retry an unreachable URL forever instead of telling the user.
        nc = await asyncio.wait_for(
            nats.connect(
                url,
                name=name,
                user=user,
                password=password,
                connect_timeout=connect_timeout,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,
                allow_reconnect=True,
                error_cb=error_cb,
                disconnected_cb=reconnects.on_disconnect,
                reconnected_cb=reconnects.on_reconnect,
            ),
            timeout=connect_timeout,
        )
    except (OSError, nats.errors.NoServersError, TimeoutError) as exc:
        raise BusError(
            f"cannot connect to NATS at {url}: {exc!r}; is the server running? "
            "(`nanocrab up` starts one, or unset NANOCRAB_NATS_URL to use the embedded server)"
        ) from exc
    nc.nanocrab_reconnects = reconnects  # type: ignore[attr-defined]
    return nc


def reconnects_of(nc: NATS) -> Reconnects:
    rec = getattr(nc, "nanocrab_reconnects", None)
    if rec is None:
        rec = Reconnects()
        nc.nanocrab_reconnects = rec  # type: ignore[attr-defined]
    return rec


def stream_configs(cfg: BusConfig) -> tuple[StreamConfig, StreamConfig]:
    """The durable log (history is never silently lost) and the short-lived ephemeral stream."""
    storage = StorageType.FILE if cfg.storage == "file" else StorageType.MEMORY
    log_stream = StreamConfig(
        name=cfg.log_stream,
        description="nanocrab event log: immutable, replayable",
        subjects=[f"{cfg.root}.>"],
        storage=storage,
        num_replicas=cfg.replicas,
        discard=DiscardPolicy.NEW,
        max_bytes=cfg.log_max_bytes,
        max_msg_size=cfg.max_msg_bytes,
        duplicate_window=cfg.duplicate_window_s,
        deny_delete=True,
        deny_purge=True,
        allow_direct=True,
    )
    eph_stream = StreamConfig(
        name=cfg.ephemeral_stream,
        description="nanocrab ephemeral traffic: token deltas, output chunks, heartbeats",
        subjects=[f"{cfg.ephemeral_root}.>"],
        storage=storage,
        num_replicas=cfg.replicas,
        discard=DiscardPolicy.OLD,
        max_age=cfg.ephemeral_max_age_s,
        max_msg_size=cfg.max_msg_bytes,
        duplicate_window=cfg.duplicate_window_s,
        allow_msg_ttl=True,
        allow_direct=True,
    )
    return log_stream, eph_stream


async def ensure_streams(js: JetStreamContext, cfg: BusConfig) -> None:
    """Create the streams, or bring an existing stream's settings in line (idempotent)."""
    for sc in stream_configs(cfg):
        try:
            await js.stream_info(sc.name)  # type: ignore[arg-type]
        except NotFoundError:
            await js.add_stream(sc)
        else:
            await js.update_stream(sc)
