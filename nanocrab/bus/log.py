"""Appending to and reading from the durable event log.

Every append sets ``Nats-Msg-Id`` to the event id, so retrying an append (or redelivering the
event that caused it) inside the duplicate window stores it once and reports ``duplicate=True``.
Decisions that depend on state append with an expected last sequence, scoped to the event's own
subject or to a wildcard such as a whole run (``Nats-Expected-Last-Subject-Sequence-Subject``,
nats-server >= 2.11).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from opentelemetry import trace as otel

from nanocrab.bus.acks import send_acks_first
from nanocrab.bus.config import BusConfig
from nanocrab.bus.connection import ensure_streams, refusals_of
from nanocrab.bus.errors import AppendConflict, AppendRejected, BusError, PublishRefused
from nanocrab.bus.placement import decode_stored
from nanocrab.bus.subjects import Subjects
from nanocrab.bus.tracing import context_from, current_traceparent, new_traceparent
from nanocrab.events import Codec, Event, EventDecodeError

if TYPE_CHECKING:
    from nanocrab.bus.direct import DirectReader

_log = logging.getLogger(__name__)

# JetStream error codes for a failed expected-sequence check.
_CONFLICT_CODES = {10071, 10164}
H_MSG_ID = "Nats-Msg-Id"
H_EXPECTED_SEQ = "Nats-Expected-Last-Subject-Sequence"
H_EXPECTED_SCOPE = "Nats-Expected-Last-Subject-Sequence-Subject"
H_TTL = "Nats-TTL"
H_EXPECTED_LAST_ID = "Nats-Expected-Last-Msg-Id"
_UNMOVED_RETRIES_S = (0.01, 0.05, 0.2, 0.5)
"""Pauses between tries of an expected-sequence append refused on a scope that has not moved."""
_UNHEARD_RETRIES_S = (0.05, 0.1, 0.2, 0.4, 0.8)
"""Pauses between publishes of messages no stream received (``EventLog._publish``)."""


@dataclass(frozen=True, slots=True)
class Appended:
    """Where an event landed. ``duplicate`` means it was already stored (same id)."""

    event_id: str
    subject: str
    stream: str
    seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Expect:
    """An optimistic-concurrency precondition: the last sequence on ``scope`` must be ``seq``.

    ``scope=None`` means the event's own subject; pass :meth:`Subjects.run` for a whole run.
    ``seq=0`` means "nothing there yet".
    """

    seq: int
    scope: str | None = None
    neutral: Callable[[Event], bool] | None = field(default=None, compare=False)
    """Events that do not change the decision being appended when they land on ``scope`` first
    (e.g. a guardrails verdict that allows what the decision already went on with): if all
    that landed since ``seq`` is neutral, the append is made again expecting the new last
    sequence, instead of failing with :class:`AppendConflict` and leaving the decision to be
    made again on a later delivery. Bytes that are not an event are never neutral."""


_NEUTRAL_REBASES = 8
"""Appends made again past neutral events, at most, before a conflict is raised anyway."""


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: _ApiError | None = None


_NO_RESPONDERS = _PubAck(
    error=_ApiError(503, 0, "no stream listens on this subject (no responders)")
)
_pub_ack_decoder = msgspec.json.Decoder(_PubAck)


class _AckCollector:
    """Collects JetStream publish acks for single and pipelined appends on one wildcard inbox.

    Cheaper per message than ``publish_async`` (one future per *batch*, acks decoded by msgspec),
    which is what lets a batch append keep up with the server. A publish the broker refuses is
    never acknowledged: the connection's :class:`~nanocrab.bus.connection.Refusals` tells the
    collector, which fails the appends waiting on that subject at once.
    """

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self._next = 0
        self._open: dict[
            int,
            tuple[list[_PubAck | None], list[int], asyncio.Future[list[_PubAck]], Sequence[str]],
        ] = {}
        self._refusals = refusals_of(nc)
        self._refusals.listen(self._on_refused)

    async def start(self) -> None:
        await self.nc.subscribe(f"{self.prefix}.*", cb=self._on_ack)

    def open(self, subjects: Sequence[str]) -> tuple[int, asyncio.Future[list[_PubAck]]]:
        self._next += 1
        future: asyncio.Future[list[_PubAck]] = asyncio.get_running_loop().create_future()
        self._open[self._next] = ([None] * len(subjects), [len(subjects)], future, subjects)
        return self._next, future

    def _on_refused(self, subject: str) -> None:
        """Fail every open append that published on ``subject`` (lower-cased by nats-py)."""
        for _, _, future, subjects in self._open.values():
            if future.done():
                continue
            refused = next((s for s in subjects if s.lower() == subject), None)
            if refused is not None:
                future.set_exception(PublishRefused(self._refusals.identity, refused))

    def close(self, batch_id: int) -> None:
        self._open.pop(batch_id, None)

    def reply(self, batch_id: int, index: int) -> str:
        return f"{self.prefix}.{batch_id}-{index}"

    async def _on_ack(self, msg: Msg) -> None:
        batch, _, index = msg.subject.rpartition(".")[2].partition("-")
        entry = self._open.get(int(batch))
        if entry is None:
            return  # a batch that timed out
        acks, remaining, future, _ = entry
        i = int(index)
        if acks[i] is not None:
            return
        if not msg.data and (msg.headers or {}).get("Status") == "503":
            acks[i] = _NO_RESPONDERS
        else:
            try:
                acks[i] = _pub_ack_decoder.decode(msg.data)
            except msgspec.DecodeError:
                acks[i] = _PubAck(error=_ApiError(0, 0, f"unreadable ack {msg.data[:100]!r}"))
        remaining[0] -= 1
        if remaining[0] == 0 and not future.done():
            future.set_result(cast(list[_PubAck], acks))  # remaining 0: every slot is set


@dataclass(frozen=True, slots=True)
class RawMessage:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


class EventLog:
    """The write side of the bus, plus point reads by sequence.

    Bytes read back from the streams become events only through :meth:`decode`, which also
    checks that the event was stored on its own subject.

    Appends publish as the connection's identity: with broker permissions on, one the identity
    may not publish raises :class:`PublishRefused` as soon as the server says so.
    """

    def __init__(self, nc: NATS, cfg: BusConfig, *, codec: Codec | None = None) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=cfg.append_timeout_s)
        self.cfg = cfg
        self.direct = cfg.replicas == 1
        """Reads by direct get (any replica answers); on a replicated log, through the leader:
        a follower may not hold a message just written (bus/direct.py)."""
        self.codec = codec or Codec(max_bytes=cfg.max_event_bytes)
        self.subjects = Subjects(cfg.root, cfg.ephemeral_root)
        self._acks: _AckCollector | None = None
        self._acks_lock = asyncio.Lock()
        self._reader: DirectReader | None = None

    @classmethod
    async def open(cls, nc: NATS, cfg: BusConfig, *, codec: Codec | None = None) -> EventLog:
        """Create or update the streams, then return a log bound to them."""
        log = cls(nc, cfg, codec=codec)
        await ensure_streams(log.js, cfg)
        return log

    def prepare(
        self, event: Event, trace: str | None = None
    ) -> tuple[Event, str, bytes, dict[str, str]]:
        """Pick the subject, encode, and build the headers.

        An event without trace context gets ``trace``, else the active span's, else a new root.
        """
        trace = event.trace or trace or current_traceparent() or new_traceparent()
        subject = self.subjects.for_event(event)
        payload = self.codec.encode(event, subject=subject, trace=trace)
        headers = {H_MSG_ID: event.id, "traceparent": trace}
        if event.ephemeral:
            headers[H_TTL] = f"{int(self.cfg.ephemeral_ttl_s)}s"
        return event, subject, payload, headers

    async def append(self, event: Event, *, expect: Expect | None = None) -> Appended:
        """Append one event and wait for JetStream's acknowledgement.

        Raises :class:`AppendConflict` (nothing stored) when ``expect`` does not hold: the log
        has moved past ``expect.seq`` on its scope. A refusal while it has not is retried here
        (briefly), then raised as a :class:`BusError` for the caller to retry later.
        """
        event, subject, payload, headers = self.prepare(event)
        if expect is not None:
            headers[H_EXPECTED_SEQ] = str(expect.seq)
            if expect.scope is not None:
                headers[H_EXPECTED_SCOPE] = expect.scope
        what = f"{event.type} {event.id}"
        unmoved = iter((*_UNMOVED_RETRIES_S, None))
        rebases = _NEUTRAL_REBASES
        while True:
            (ack,) = await self._publish([(subject, payload, headers)], what=what)
            if ack.error is None:
                return Appended(event.id, subject, ack.stream, ack.seq, ack.duplicate)
            if ack.error.err_code not in _CONFLICT_CODES or expect is None:
                raise _rejected(event, subject, ack)
            scope = expect.scope or subject
            since = await self._since(scope, expect.seq)
            earlier = next((m.seq for m in since if m.headers.get(H_MSG_ID) == event.id), None)
            if earlier is not None:
                return Appended(event.id, subject, self.cfg.log_stream, earlier, True)
            if since and rebases and self._all_neutral(since, expect.neutral):
                rebases -= 1  # what slipped in changes nothing: the same decision, on top of it
                expect = Expect(since[-1].seq, expect.scope, expect.neutral)
                headers[H_EXPECTED_SEQ] = str(expect.seq)
                continue
            if since or await self.last_seq(scope) != expect.seq:
                raise AppendConflict(scope, expect.seq, _describe(ack.error))
            # Refused, yet nothing was stored on the scope since: a replicated stream's leader
            # refuses an expectation on a scope while another one on it is still being applied
            # ("last sequence by subject mismatch", err_code 10164), for a moment after that
            # one was acknowledged. Not a conflict: the append is tried again.
            _log.warning("%s refused on %s, which has not moved past %d: %s", what, scope,
                         expect.seq, _describe(ack.error))  # fmt: skip
            pause = next(unmoved)
            if pause is None:
                raise BusError(f"{what}: refused again and again though the log has not moved "
                               "past the expected sequence; to be retried")  # fmt: skip
            await asyncio.sleep(pause)

    async def append_pipelined(self, events: Sequence[Event], expect: Expect) -> list[Appended]:
        """Publish a decision's events in one round trip: the first under ``expect``, each next
        one expecting the one before it as the stream's last message
        (``Nats-Expected-Last-Msg-Id``), so it lands only right behind it, with nothing of any
        writer in between. Returns what was newly stored, a prefix of ``events`` in order
        (empty when the first was refused or already stored); the caller appends the rest the
        careful way, one round trip each (:func:`nanocrab.bus.reactions.append_chained`). The
        guard is stricter than the careful way's (the whole stream rather than the run's
        scope), so an event another run slipped in between costs only that fallback."""
        messages = []
        previous: str | None = None
        for event in events:
            _, subject, payload, headers = self.prepare(event)
            if previous is None:
                headers[H_EXPECTED_SEQ] = str(expect.seq)
                if expect.scope is not None:
                    headers[H_EXPECTED_SCOPE] = expect.scope
            else:
                headers[H_EXPECTED_LAST_ID] = previous
            previous = event.id
            messages.append((subject, payload, headers))
        acks = await self._publish(messages, what=f"decision of {len(events)}")
        stored: list[Appended] = []
        for event, (subject, _, _), ack in zip(events, messages, acks, strict=True):
            if ack.error is not None or ack.duplicate:
                break
            stored.append(Appended(event.id, subject, ack.stream, ack.seq, False))
        return stored

    def _all_neutral(
        self, stored: Sequence[RawMessage], neutral: Callable[[Event], bool] | None
    ) -> bool:
        if neutral is None:
            return False
        for m in stored:
            try:
                if not neutral(self.decode(m.data, subject=m.subject)):
                    return False
            except EventDecodeError:
                return False
        return True

    async def append_nowait(self, event: Event) -> None:
        """Publish without waiting for JetStream's acknowledgement.

        For ephemeral progress (token deltas, output chunks): a lost chunk costs nothing, and
        waiting for each ack would slow the producer down to the round-trip time.
        """
        _, subject, payload, headers = self.prepare(event)
        try:
            await send_acks_first(self.nc)
            await self.nc.publish(subject, payload, headers=headers)
        except nats.errors.Error as exc:
            raise BusError(f"could not publish {event.type}: {exc!r}") from exc

    async def append_batch(self, events: Sequence[Event]) -> list[Appended]:
        """Pipeline many appends and wait (bounded) until all are acknowledged, in order.

        On failure some events may be stored and others not; since every event has a stable id,
        retrying the whole batch is safe.
        """
        if not events:
            return []
        trace = current_traceparent() or new_traceparent()  # one per batch when none is set
        prepared = [self.prepare(e, trace) for e in events]
        acks = await self._publish(
            [(subject, payload, headers) for _, subject, payload, headers in prepared],
            what=f"batch of {len(events)}",
        )
        results = []
        for (ev, subject, _, _), ack in zip(prepared, acks, strict=True):
            if ack.error is not None:
                raise _rejected(ev, subject, ack)
            results.append(Appended(ev.id, subject, ack.stream, ack.seq, ack.duplicate))
        return results

    async def _publish(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], *, what: str
    ) -> list[_PubAck]:
        """Publish in order, then wait (bounded) for every acknowledgement.

        Messages nobody received (no responders: nothing stored) are published again after a
        short pause, all of them or none, so the batch keeps its order: a cluster's node learns
        of a new stream's subjects a moment after the stream exists, and a stream that lost its
        leader has none until the survivors elect one. Still unheard after the pauses, the acks
        say so (the caller raises "no responders")."""
        pauses = iter(_UNHEARD_RETRIES_S)
        while True:
            acks = await self._publish_once(messages, what=what)
            if any(ack is not _NO_RESPONDERS for ack in acks):
                return acks
            pause = next(pauses, None)
            if pause is None:
                return acks
            await asyncio.sleep(pause)

    async def _publish_once(
        self, messages: Sequence[tuple[str, bytes, dict[str, str]]], *, what: str
    ) -> list[_PubAck]:
        acks = self._acks or await self._start_acks()
        batch_id, done = acks.open([subject for subject, _, _ in messages])
        try:
            await send_acks_first(self.nc)
            for i, (subject, payload, headers) in enumerate(messages):
                await self.nc.publish(
                    subject, payload, reply=acks.reply(batch_id, i), headers=headers
                )
            return await asyncio.wait_for(done, timeout=self.cfg.append_timeout_s)
        except TimeoutError as exc:
            raise BusError(
                f"no acknowledgement for {what} within {self.cfg.append_timeout_s}s"
            ) from exc
        except nats.errors.Error as exc:
            raise BusError(f"{what} failed: {exc!r}") from exc
        finally:
            acks.close(batch_id)

    async def _start_acks(self) -> _AckCollector:
        """Subscribe the ack inbox once; concurrent first appends wait for the same one (a
        publish sent before the inbox is subscribed would lose its ack)."""
        async with self._acks_lock:
            if self._acks is None:
                acks = _AckCollector(self.nc)
                await acks.start()
                self._acks = acks
        return self._acks

    async def _since(self, scope: str, after: int) -> list[RawMessage]:
        """What was stored on ``scope`` after ``after``, in one batched direct get: whether a
        refused append's event is among it (below), and whether the scope moved at all.

        nats-server 2.15 checks the expected sequence *before* the duplicate window, so a retried
        append whose first attempt landed (ack lost) comes back as a conflict; this tells that case
        apart from a real one by looking at what was appended since (one round trip: a message
        at a time, then the scope's last sequence, took three for the usual one-event conflict).
        """
        if self._reader is None:
            from nanocrab.bus.direct import DirectReader  # it reads through this module's types

            self._reader = DirectReader(self.nc, self.cfg.log_stream, leader_only=not self.direct)
        return await self._reader.after(scope, after)

    async def last_seq(self, scope: str) -> int:
        """The sequence of the newest event on ``scope`` (wildcards allowed), 0 when none."""
        try:
            msg = await self.js.get_last_msg(self.cfg.log_stream, scope, direct=self.direct)
        except NotFoundError:
            return 0
        return int(msg.seq or 0)

    async def get(self, seq: int, *, stream: str | None = None) -> RawMessage:
        """The raw message at ``seq``; its bytes become an event through :meth:`decode`."""
        msg = await self.js.get_msg(stream or self.cfg.log_stream, seq, direct=self.direct)
        return RawMessage(
            seq=int(msg.seq or seq),
            subject=msg.subject or "",
            data=msg.data or b"",
            headers=dict(msg.headers or {}),
        )

    def decode(self, data: bytes, *, subject: str) -> Event:
        """The event stored as ``data`` on ``subject``: how every reader of the log decodes.

        Raises :class:`EventDecodeError` when the bytes are not an event, and its subclass
        :class:`~nanocrab.bus.placement.Misplaced` when the event is not the kind the broker
        lets anyone store on ``subject`` (see ``bus/placement.py``).
        """
        return decode_stored(self.codec, self.subjects, subject, data)

    async def read(self, seq: int) -> Event:
        """Decode the event at ``seq``; raises :class:`EventDecodeError` when it is not one, or
        is one stored on another subject than its own."""
        raw = await self.get(seq)
        return self.decode(raw.data, subject=raw.subject)

    async def stream_last_seq(self, stream: str | None = None) -> int:
        info = await self.js.stream_info(stream or self.cfg.log_stream)
        return int(info.state.last_seq)


def _describe(error: _ApiError) -> str:
    return f"{error.description} (code {error.code}, err_code {error.err_code})"


def _rejected(event: Event, subject: str, ack: _PubAck) -> AppendRejected:
    assert ack.error is not None
    if ack is _NO_RESPONDERS:
        return AppendRejected(
            f"{event.type} {event.id}: no stream listens on {subject} (no responders); "
            "are the streams set up on this server? (EventLog.open creates them)"
        )
    return AppendRejected(
        f"{event.type} {event.id} refused: {_describe(ack.error)}",
        code=ack.error.code,
        err_code=ack.error.err_code,
    )


__all__ = ["Appended", "EventDecodeError", "EventLog", "Expect", "RawMessage"]


async def append_traced(log: EventLog, event: Event, *, parent: str | None = None) -> Appended:
    """Append ``event`` from inside a producer span of its own, exported like a handler's.

    With ``parent`` (the run's ``traceparent``) the span — and so the event — joins that trace:
    a person's approval, message or cancellation belongs to the run's one trace, not a new one.
    Without it the span is a new trace's root (a task being submitted), so the root span of a
    run's trace is written, not only referenced.
    """
    tracer = otel.get_tracer("nanocrab.bus")
    with tracer.start_as_current_span(
        f"publish {event.type}",
        context=context_from(parent),
        kind=otel.SpanKind.PRODUCER,
        attributes={
            "messaging.system": "nats",
            "messaging.message.id": event.id,
            "nanocrab.run_id": event.run_id or "",
            "nanocrab.source": event.source,
        },
    ):
        return await log.append(msgspec.structs.replace(event, trace=None))
