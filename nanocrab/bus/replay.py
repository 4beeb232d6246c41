"""Reading history with ordered ephemeral consumers (never a handler's durable consumer).

``read`` yields the stored messages matching a filter from a start point up to the end of the
stream *as it was when reading began*; ``follow`` keeps going with new events. Messages that do
not decode are yielded too (with ``error`` set) so a timeline can show them instead of hiding them;
so are events stored on another subject than their own (``error`` is a
:class:`~nanocrab.bus.placement.Misplaced`, ``event`` is ``None``): a reader shows them as
rejected and never folds them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from nanocrab.bus.log import EventLog
from nanocrab.events import Event, EventDecodeError


class Stored(msgspec.Struct, frozen=True):
    """One message of the log: its position, subject, and the event (or why it is not one).

    ``event`` is set only for an event that decodes *and* was stored on its own subject.
    """

    seq: int
    subject: str
    stored_ns: int
    event: Event | None
    error: EventDecodeError | None = None
    raw: bytes = b""

    @property
    def stored_at(self) -> datetime:
        """When JetStream stored the message."""
        return datetime.fromtimestamp(self.stored_ns / 1e9, UTC)


class Position(NamedTuple):
    """What the reply subject of a pushed JetStream message says about it."""

    stream_seq: int
    stored_ns: int
    pending: int


def position(msg: Msg) -> Position:
    """Parse ``$JS.ACK...`` once, cheaply (nats-py's ``metadata`` builds two dataclasses and a
    datetime per message, which dominates replay and rebuild time)."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        return Position(int(tokens[5]), int(tokens[7]), int(tokens[8]))
    if len(tokens) >= 11:  # v2: domain and account hash after $JS.ACK
        return Position(int(tokens[7]), int(tokens[9]), int(tokens[10]))
    meta = msg.metadata  # raises NotJSMessageError for anything else
    return Position(meta.sequence.stream, int(meta.timestamp.timestamp() * 1e9), meta.num_pending)


@dataclass(frozen=True, slots=True)
class Window:
    """Where to start and stop: by sequence range and/or by time."""

    start_seq: int | None = None
    end_seq: int | None = None
    start_time: datetime | None = None


def consumer_config(window: Window) -> ConsumerConfig:
    if window.start_seq is not None and window.start_seq > 1:
        return ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=window.start_seq
        )
    if window.start_time is not None:
        return ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=window.start_time
        )
    return ConsumerConfig(deliver_policy=DeliverPolicy.ALL)


def to_stored(
    log: EventLog, msg: Msg, pos: Position | None = None, *, keep_raw: bool = False
) -> Stored:
    pos = pos or position(msg)
    try:
        event: Event | None = log.decode(msg.data, subject=msg.subject)
        error = None
    except EventDecodeError as exc:
        event, error = None, exc
    return Stored(
        seq=pos.stream_seq,
        subject=msg.subject,
        stored_ns=pos.stored_ns,
        event=event,
        error=error,
        raw=msg.data if (keep_raw or error) else b"",
    )


async def messages(
    log: EventLog,
    subject_filter: str,
    window: Window = Window(),
    *,
    follow: bool = False,
    stream: str | None = None,
    idle_heartbeat_s: float = 2.0,
) -> AsyncIterator[Msg]:
    """Raw ordered delivery of ``subject_filter`` on ``stream`` (the log by default)."""
    stream = stream or log.cfg.log_stream
    queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=4096)

    async def put(msg: Msg) -> None:
        await queue.put(msg)

    sub = await log.js.subscribe(
        subject_filter,
        stream=stream,
        cb=put,
        ordered_consumer=True,
        idle_heartbeat=idle_heartbeat_s,
        config=consumer_config(window),
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=1024 * 1024 * 1024,
    )
    try:
        if not follow:
            info = await sub.consumer_info()
            assert info.delivered is not None  # the server always reports it
            if info.num_pending == 0 and info.delivered.consumer_seq == 0 and queue.empty():
                # Nothing matches the filter from the start point; do not wait for delivery.
                await asyncio.sleep(0)
                if queue.empty():
                    return
        while True:
            msg = await queue.get()
            pos = position(msg)
            if window.end_seq is not None and pos.stream_seq > window.end_seq:
                return
            yield msg
            if not follow and pos.pending == 0:
                return
    finally:
        with contextlib.suppress(nats.errors.Error, OSError):
            await sub.unsubscribe()


async def read(
    log: EventLog, subject_filter: str, window: Window = Window(), *, follow: bool = False
) -> AsyncIterator[Stored]:
    """Decoded events matching ``subject_filter`` within ``window``."""
    async for msg in messages(log, subject_filter, window, follow=follow):
        yield to_stored(log, msg)


async def read_run(log: EventLog, run_id: str) -> list[Stored]:
    """Every event of one run, in log order."""
    return [s async for s in read(log, log.subjects.run(run_id))]
