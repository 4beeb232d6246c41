"""Delivery of the log to projectors: batches, and one subscription shared by several.

A :class:`Batcher` collects decoded events into batches for one projector. A :class:`SharedFeed`
lets the projectors of one process (the projection worker, or a host running them in its loop)
follow the log through one ordered push consumer instead of one each: every event is then
pushed by the server, parsed and decoded once rather than once per projection (eight times per
event with the bundled ones, the worker's largest cost per run, docs/architecture.md), and
handed to the batcher of each projector whose subject filter it matches.

What each projector receives is what its own subscription would have delivered from its start:
every matching event after its start, in log order, each once (a member's ``fed`` sequence
skips what a restarted subscription delivers again). Projectors still apply each batch in one
transaction with their checkpoint, so what a feed could deliver twice is applied once anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from nanocrab.bus import EventLog, Stored, Window
from nanocrab.bus.replay import consumer_config, position, to_stored
from nanocrab.bus.subjects import matches_filter

Item = tuple[Stored, int]
"""A delivered event and how many messages the consumer said were still pending after it."""

_UNSUBSCRIBE_ERRORS = (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError)


async def follow(
    log: EventLog, subject: str, start_seq: int, cb: Callable[[Msg], Awaitable[None]]
) -> JetStreamContext.PushSubscription:
    """An ordered push consumer delivering ``subject`` of the log from ``start_seq`` to ``cb``
    (how a projector follows the log, alone or through a :class:`SharedFeed`)."""
    return await log.js.subscribe(
        subject,
        stream=log.cfg.log_stream,
        cb=cb,
        ordered_consumer=True,
        idle_heartbeat=1.0,
        config=consumer_config(Window(start_seq=start_seq)),
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=1024 * 1024 * 1024,
    )


class Batcher:
    """Collects delivered events into batches with one wake-up per batch, not per event.

    A batch is handed out when it is full, when the stream says nothing more is pending, or
    ``idle_flush_s`` after its first event. :meth:`add` blocks (back-pressure into the ordered
    consumer's flow control) when ``8 * size`` events are waiting.
    """

    def __init__(self, size: int, idle_flush_s: float, log: EventLog | None = None) -> None:
        """``log``: decodes the messages :meth:`put` receives (a subscription's callback)."""
        self.size = size
        self.idle_flush_s = idle_flush_s
        self.log = log
        self.buf: list[Item] = []
        self.nonempty = asyncio.Event()
        self.full = asyncio.Event()
        self.drained = asyncio.Event()
        self.drained.set()
        self.closed = False

    async def put(self, msg: Msg) -> None:
        """A subscription's callback: the message, decoded."""
        assert self.log is not None
        pos = position(msg)
        await self.add(to_stored(self.log, msg, pos), pos.pending)

    async def add(self, stored: Stored, pending: int) -> None:
        while len(self.buf) >= 8 * self.size and not self.closed:
            self.drained.clear()
            await self.drained.wait()
        if self.closed:
            return  # nobody takes from it any more
        self.buf.append((stored, pending))
        self.nonempty.set()
        if len(self.buf) >= self.size or pending == 0:
            self.full.set()

    def close(self) -> None:
        """Nobody will take from it again: an :meth:`add` waiting for room returns now."""
        self.closed = True
        self.drained.set()

    def wake(self) -> None:
        """End a waiting :meth:`take` early (it returns ``None`` when nothing arrived)."""
        self.nonempty.set()

    async def take(self, timeout_s: float) -> list[Item] | None:
        """The next batch, or ``None`` when nothing arrived within ``timeout_s``."""
        if not self.buf:
            self.nonempty.clear()
            try:
                await asyncio.wait_for(self.nonempty.wait(), timeout_s)
            except TimeoutError:
                return None
            if not self.buf:  # woken by wake()
                return None
        if len(self.buf) < self.size and self.buf[-1][1] > 0:
            self.full.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.full.wait(), self.idle_flush_s)
        batch, self.buf = self.buf[: self.size], self.buf[self.size :]
        self.drained.set()
        return batch


@dataclass
class _Member:
    tokens: list[str]
    batcher: Batcher
    fed: int
    """The highest stream sequence handed to ``batcher`` (or its start - 1)."""


class SharedFeed:
    """One ordered push consumer on everything under the log's root, fanned out to the
    batchers of the projectors attached to it (each with its own subject filter and start).

    The subscription starts at the lowest start of the members; a member that attaches needing
    events the subscription has already passed (a projector retrying from its checkpoint, or
    following again after a reconnect) has it started again from there, and the members
    further on skip what they were already given.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.subject = f"{log.cfg.root}.>"
        self._members: dict[object, _Member] = {}
        self._sub: JetStreamContext.PushSubscription | None = None
        self._delivered = 0
        """The stream sequence the subscription has reached (its start - 1 before any)."""
        self._lock = asyncio.Lock()
        self._generation = 0

    async def attach(self, owner: object, subject_filter: str, start_seq: int,
                     batcher: Batcher) -> None:  # fmt: skip
        """Deliver to ``batcher`` every event matching ``subject_filter`` from ``start_seq`` on
        (replacing what ``owner`` had attached before)."""
        async with self._lock:
            old = self._members.get(owner)
            if old is not None:
                old.batcher.close()
            self._members[owner] = _Member(subject_filter.split("."), batcher, start_seq - 1)
            if self._sub is None or start_seq <= self._delivered:
                try:
                    await self._subscribe()
                except BaseException:
                    del self._members[owner]  # not attached: nobody would take from its batcher
                    raise

    async def ensure(self) -> None:
        """Subscribe again if a failed restart left the members without a subscription (the
        members call it when idle)."""
        if self._sub is None and self._members:
            async with self._lock:
                if self._sub is None and self._members:
                    await self._subscribe()

    async def detach(self, owner: object) -> None:
        """Stop delivering to ``owner``; the subscription ends with its last member."""
        async with self._lock:
            member = self._members.pop(owner, None)
            if member is not None:
                member.batcher.close()  # the delivery blocked on its room, if any, goes on
            if not self._members:
                await self._unsubscribe()

    async def close(self) -> None:
        async with self._lock:
            for member in self._members.values():
                member.batcher.close()
            self._members.clear()
            await self._unsubscribe()

    async def _subscribe(self) -> None:
        await self._unsubscribe()
        start = min(m.fed for m in self._members.values()) + 1
        self._delivered = start - 1
        self._generation += 1
        self._sub = await follow(
            self.log, self.subject, start, functools.partial(self._on_msg, self._generation)
        )

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(*_UNSUBSCRIBE_ERRORS):
                await sub.unsubscribe()

    async def _on_msg(self, generation: int, msg: Msg) -> None:
        if generation != self._generation:
            return  # a superseded subscription's (its successor delivers it again if needed)
        pos = position(msg)
        seq = pos.stream_seq
        self._delivered = max(self._delivered, seq)
        tokens = msg.subject.split(".")
        stored: Stored | None = None
        for member in list(self._members.values()):
            if seq <= member.fed or not matches_filter(tokens, member.tokens):
                continue
            if stored is None:
                stored = to_stored(self.log, msg, pos)
            member.fed = seq
            await member.batcher.add(stored, pos.pending)
