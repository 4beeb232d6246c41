"""Connecting to NATS (as an nkey identity when the broker enforces permissions), reporting
what the server refuses, and preparing the streams."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import weakref
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, Placement, StorageType, StreamConfig, StreamInfo
from nats.js.errors import NotFoundError

from nanocrab.bus.config import BusConfig
from nanocrab.bus.errors import AuthenticationFailed, BusError
from nanocrab.bus.natsparse import FastParser

log = logging.getLogger(__name__)
T = TypeVar("T")

# nats-py lower-cases the server's ``-ERR 'Permissions Violation for Publish to "<subject>"'``
_PUBLISH_REFUSED = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)


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


class Refusals:
    """Publishes the server refused on one connection, reported to whoever waits for them.

    A refused PUB is dropped by the server, which says so only with an asynchronous
    ``-ERR 'Permissions Violation for Publish to "<subject>"'`` (the connection stays up). A
    JetStream publish would then wait for an acknowledgement that never comes; the event log's
    ack collector listens here instead and fails the waiting append at once.
    """

    def __init__(self, identity: str | None = None) -> None:
        self.identity = identity
        self._listeners: list[weakref.WeakMethod[Callable[[str], None]]] = []

    def listen(self, listener: Callable[[str], None]) -> None:
        """Call the bound method ``listener(subject)`` (lower-cased, as nats-py reports it) on
        each refusal, for as long as its object lives."""
        self._listeners = [ref for ref in self._listeners if ref() is not None]
        self._listeners.append(weakref.WeakMethod(listener))

    def report(self, error: str) -> bool:
        """Handle a server error message; ``True`` when it was a refused publish."""
        match = _PUBLISH_REFUSED.search(error)
        if match is None:
            return False
        subject = match.group(1).lower()
        for ref in self._listeners:
            listener = ref()
            if listener is not None:
                listener(subject)
        return True


class Client(NATS):
    """nats-py's client with a header parser half as costly: every delivery and direct read
    carries several headers, and nats-py's check of each name for whitespace (a generator per
    name) was a few per cent of a busy handler process's event loop. Same result: ``Name:
    Value`` lines, names without whitespace, values stripped and decoded as UTF-8 with
    replacement (``tests/test_bus_connection.py``). Its protocol parser reads message frames
    without nats-py's regular expressions (:class:`~nanocrab.bus.natsparse.FastParser`)."""

    def __init__(self) -> None:
        super().__init__()
        self._ps = FastParser(self)

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in raw.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            words = name.split()
            if not sep or len(words) > 1:
                continue  # no colon, or whitespace inside the name
            try:
                key = words[0].decode("ascii") if words else ""
            except UnicodeDecodeError:
                continue
            out[key] = value.strip().decode("utf-8", "replace")
        return out


async def connect(
    url: str,
    *,
    name: str = "nanocrab",
    user: str | None = None,
    password: str | None = None,
    nkey_seed: bytes | None = None,
    identity: str | None = None,
    connect_timeout: float = 5.0,
) -> NATS:
    """A client that reconnects forever, quickly: handlers ride out a server restart.

    With ``nkey_seed`` the connection authenticates as that nkey user; ``identity`` names it in
    errors (a refused publish or refused credentials say who was refused).
    """
    reconnects = Reconnects()
    refusals = Refusals(identity)
    credentials_refused = asyncio.Event()
    who = f"identity {identity!r}" if identity else "this client"

    async def error_cb(exc: Exception) -> None:
        text = str(exc).lower()
        if "authorization violation" in text:
            credentials_refused.set()
            log.warning("nats %s: the server refused the credentials of %s", name, who)
        elif refusals.report(text) or "permissions violation" in text:
            # a refused subscription or API request has no waiter to fail: only the log says
            log.warning("nats %s: %s refused: %s", name, who, exc)
        else:
            log.debug("nats %s: %r", name, exc)

    client = Client()
    # seconds, fractions included (nats-py annotates them as int and uses them as float)
    timings: dict[str, Any] = {"connect_timeout": connect_timeout, "reconnect_time_wait": 0.25}
    attempt = asyncio.ensure_future(
        client.connect(
            [u.strip() for u in url.split(",") if u.strip()],  # a cluster: every node's URL
            name=name,
            user=user,
            password=password,
            nkeys_seed_str=nkey_seed.decode() if nkey_seed else None,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            error_cb=error_cb,
            disconnected_cb=reconnects.on_disconnect,
            reconnected_cb=reconnects.on_reconnect,
            **timings,
        )
    )
    refused = asyncio.ensure_future(credentials_refused.wait())
    try:
        # The deadline bounds the *first* connection: with unlimited reconnects nats-py would
        # otherwise retry an unreachable URL, or refused credentials, forever.
        await asyncio.wait(
            {attempt, refused}, timeout=connect_timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        refused.cancel()
        if not attempt.done():
            attempt.cancel()
            with contextlib.suppress(asyncio.CancelledError, nats.errors.Error, OSError):
                await attempt
    try:
        if attempt.cancelled():
            if credentials_refused.is_set():
                raise nats.errors.AuthorizationError()
            raise TimeoutError()
        attempt.result()
        nc = client
    except (OSError, nats.errors.NoServersError, TimeoutError) as exc:
        raise BusError(
            f"cannot connect to NATS at {url}: {exc!r}; is the server running? "
            "(`nanocrab up` starts one, or unset NANOCRAB_NATS_URL to use the embedded server)"
        ) from exc
    except nats.errors.Error as exc:
        text = str(exc).lower()
        if "authorization" not in text:
            raise BusError(f"cannot connect to NATS at {url}: {exc!r}") from exc
        raise AuthenticationFailed(
            f"NATS at {url} refused the credentials of {who} (authorization violation): "
            + (
                "is its nkey seed one the server's config lists? "
                "(`nanocrab security nats-config` prints the config for this data dir's keys)"
                if nkey_seed
                else "the server requires each client to authenticate with its own nkey "
                "(docs/security.md)"
            )
        ) from exc
    nc.nanocrab_reconnects = reconnects  # type: ignore[attr-defined]  # ours, kept on the client
    nc.nanocrab_refusals = refusals  # type: ignore[attr-defined]  # ours, kept on the client
    return nc


def reconnects_of(nc: NATS) -> Reconnects:
    rec = getattr(nc, "nanocrab_reconnects", None)
    if rec is None:
        rec = Reconnects()
        nc.nanocrab_reconnects = rec  # type: ignore[attr-defined]  # ours, kept on the client
    return rec


def refusals_of(nc: NATS) -> Refusals:
    rec = getattr(nc, "nanocrab_refusals", None)
    if rec is None:
        rec = Refusals()
        nc.nanocrab_refusals = rec  # type: ignore[attr-defined]  # ours, kept on the client
    return rec


def placement_of(cfg: BusConfig) -> Placement | None:
    """Where the streams' replicas go (``None``: the server chooses)."""
    if cfg.placement_cluster is None and not cfg.placement_tags:
        return None
    return Placement(cluster=cfg.placement_cluster, tags=list(cfg.placement_tags) or None)


def stream_configs(cfg: BusConfig) -> tuple[StreamConfig, StreamConfig]:
    """The durable log (history is never silently lost) and the short-lived ephemeral stream."""
    storage = StorageType.FILE if cfg.storage == "file" else StorageType.MEMORY
    log_stream = StreamConfig(
        name=cfg.log_stream,
        description="nanocrab event log: immutable, replayable",
        subjects=[f"{cfg.root}.>"],
        storage=storage,
        num_replicas=cfg.replicas,
        placement=placement_of(cfg),
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
        placement=placement_of(cfg),
        discard=DiscardPolicy.OLD,
        max_age=cfg.ephemeral_max_age_s,
        max_msg_size=cfg.max_msg_bytes,
        duplicate_window=cfg.duplicate_window_s,
        allow_msg_ttl=True,
        allow_direct=True,
    )
    return log_stream, eph_stream


async def patiently(
    request: Callable[[], Awaitable[T]], what: str, *, patience_s: float = 20.0
) -> T:
    """``request()`` (an idempotent JetStream API request), waiting out a leader election: on a
    cluster that just lost a node, requests to the groups it led (a stream's, or the meta group
    that creates and updates streams) time out or get "unavailable" until the survivors elect a
    new leader (seconds). Raises :class:`BusError` when none answers within ``patience_s``
    (the quorum is lost)."""
    deadline = asyncio.get_running_loop().time() + patience_s
    while True:
        try:
            return await request()
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise BusError(
                    f"{what}: no answer within {patience_s:.0f}s: no leader (has the cluster "
                    "lost its quorum? docs/scaling.md)"
                ) from exc
            log.info("%s: no answer yet (%s); asking again", what, type(exc).__name__)
            if isinstance(exc, nats.js.errors.ServiceUnavailableError):
                await asyncio.sleep(0.25)  # answered at once: not again at once


async def stream_info(js: JetStreamContext, name: str, *, patience_s: float = 20.0) -> StreamInfo:
    """The stream's info, waiting out a leader election (:func:`patiently`)."""
    return await patiently(lambda: js.stream_info(name), f"stream {name}", patience_s=patience_s)


async def ensure_streams(js: JetStreamContext, cfg: BusConfig) -> None:
    """Create the streams, or bring an existing stream's settings in line (idempotent; each
    request waits out a leader election, :func:`patiently`)."""
    for sc in stream_configs(cfg):
        assert sc.name is not None  # stream_configs names every stream
        try:
            await stream_info(js, sc.name)
        except NotFoundError:
            await patiently(partial(js.add_stream, sc), f"creating stream {sc.name}")
        else:
            await patiently(partial(js.update_stream, sc), f"updating stream {sc.name}")
