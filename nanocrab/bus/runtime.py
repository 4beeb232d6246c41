"""Runs a reactor on a durable pull consumer (DESIGN §5).

Per message: decode → dispatch → append reactions (pipelined, deterministic ids) → ack. The ack
comes only after JetStream acknowledged every reaction, so a crash anywhere before it leads to a
redelivery whose reactions deduplicate. Malformed input and poison events are terminated and
recorded as ``bus.malformed`` / ``bus.dead_lettered`` events (pointing at the original bytes by
stream sequence); the loop goes on with the next message. An event stored on another subject than
its own (``bus/placement.py``) is malformed input: ``bus.malformed`` with kind ``invalid``.
Transient failures are nak'd with backoff until ``max_deliver``. The subscription is re-created
after a server restart. Bus failures are classified (``bus/failures.py``): a permanent one (a full
log, a missing stream) is logged at ERROR, kept in ``failure`` and retried slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.client import JetStreamContext
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from nanocrab.bus.connection import reconnects_of
from nanocrab.bus.errors import AppendConflict, BusError, PublishRefused, TransientError
from nanocrab.bus.failures import Severity, severity
from nanocrab.bus.log import EventLog
from nanocrab.bus.reactor import Delivery, Reaction, Reactor
from nanocrab.bus.subjects import sanitize_token
from nanocrab.bus.tracing import context_from
from nanocrab.events import (
    BusDeadLettered,
    BusMalformed,
    DeadLetterKind,
    Event,
    EventDecodeError,
    derive_event_id,
)

log = logging.getLogger(__name__)

_PREVIEW_BYTES = 512
# Errors that mean "the connection or server is not there right now": rebuild the subscription.
_CONNECTION_ERRORS = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoServersError,
    nats.errors.TimeoutError,
    nats.errors.SlowConsumerError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.APIError,
    BusError,
    OSError,
)


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """Consumer tuning; the defaults suit interactive agent work."""

    batch: int = 64
    fetch_timeout_s: float = 2.0
    ack_wait_s: float = 30.0
    max_deliver: int = 6
    backoff_s: tuple[float, ...] = (0.5, 2.0, 5.0, 15.0, 30.0)
    max_ack_pending: int = 1000
    permanent_retry_s: float = 10.0
    """Pause before retrying after a permanent failure (a full log, a missing stream)."""
    concurrency: int = 1
    """Events handled at once. Above 1, events (even of one run) may be handled out of order:
    only for reactors whose decisions are guarded (``Reaction.expect``) or independent."""


def stamp(
    reactor_name: str, cause: Event, reactions: Sequence[Event], *, first: int = 0
) -> list[Event]:
    """Give each reaction its deterministic id and inherit the cause's envelope where unset.

    Reactions returned to the runtime use ordinals from 0; a handler appending progress events
    itself (``tool.started``, output chunks) stamps them with ``first`` well above that range.
    """
    out: list[Event] = []
    for i, r in enumerate(reactions, first):
        out.append(
            msgspec.structs.replace(
                r,
                id=derive_event_id(reactor_name, cause.id, i),
                source=reactor_name,
                causation_id=cause.id,
                correlation_id=r.correlation_id or cause.correlation_id or cause.id,
                tenant=cause.tenant if r.tenant == "default" else r.tenant,
                task_id=r.task_id or cause.task_id,
                run_id=r.run_id or cause.run_id,
                session_id=r.session_id or cause.session_id,
                step_id=r.step_id or cause.step_id,
            )
        )
    return out


async def append_reaction(
    log_: EventLog, handler: str, cause: Event, reaction: Reaction, *, first: int = 0
) -> bool:
    """Stamp and append a reaction; ``False`` when its precondition failed and nothing of it
    was stored (the first event carries the ``expect``, the rest follow as one batch)."""
    events = stamp(handler, cause, reaction.events, first=first)
    if not events:
        return True
    if reaction.expect is not None:
        try:
            await log_.append(events[0], expect=reaction.expect)
        except AppendConflict:
            return False
        events = events[1:]
    await log_.append_batch(events)
    return True


class HandlerRuntime:
    """One reactor bound to its durable consumer ``<reactor.name>`` on the log stream.

    Several runtimes with the same reactor name (in one process or many) share the durable and
    split the work. ``run()`` returns after ``stop()``, once the message in hand is finished.
    """

    def __init__(
        self,
        log_: EventLog,
        reactor: Reactor,
        *,
        options: RuntimeOptions | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.log = log_
        self.reactor = reactor
        self.opts = options or RuntimeOptions()
        self.tracer = tracer or trace.get_tracer("nanocrab.bus")
        self.durable = reactor.name
        self.filters = sorted(
            {log_.subjects.of_type(str(t.__struct_config__.tag)) for t in reactor.consumes}
        )
        self._stopping = asyncio.Event()
        self.processed = 0
        self.dead_lettered = 0
        self.superseded = 0
        self.failure: str | None = None
        """The permanent failure (``bus/failures.py``) this handler is stuck on, if any."""
        self._inflight: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(self.opts.concurrency)

    def consumer_config(self) -> ConsumerConfig:
        return ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            description=f"nanocrab handler {self.durable}",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.opts.ack_wait_s,
            max_deliver=self.opts.max_deliver,
            max_ack_pending=self.opts.max_ack_pending,
            filter_subjects=self.filters if len(self.filters) > 1 else None,
            filter_subject=self.filters[0] if len(self.filters) == 1 else None,
        )

    async def ensure_consumer(self) -> None:
        """Create the durable, or bring an existing one's filters up to this handler's: a newer
        version of a handler may consume more event types than the consumer a data directory
        already has (its position is kept; JetStream updates filters in place)."""
        js, stream = self.log.js, self.log.cfg.log_stream
        try:
            info = await js.consumer_info(stream, self.durable)
        except nats.js.errors.NotFoundError:
            await js.add_consumer(stream, config=self.consumer_config())
            return
        current = info.config.filter_subjects or (
            [info.config.filter_subject] if info.config.filter_subject else []
        )
        if sorted(current) != sorted(self.filters):
            log.info("handler %s: updating its consumer's filters to %s", self.durable,
                     self.filters)  # fmt: skip
            await js.add_consumer(stream, config=self.consumer_config())

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        reconnects = reconnects_of(self.log.nc)
        while not self._stopping.is_set():
            sub = None
            try:
                await self.ensure_consumer()
                sub = await self.log.js.pull_subscribe_bind(
                    durable=self.durable, stream=self.log.cfg.log_stream
                )
                generation = reconnects.generation
                while not self._stopping.is_set() and generation == reconnects.generation:
                    if self.opts.concurrency == 1:
                        for msg in await self._fetch(sub, self.opts.batch):
                            await self._process(msg)
                        continue
                    await self._slots.acquire()
                    free = 1
                    while free < self.opts.batch and not self._slots.locked():
                        await self._slots.acquire()
                        free += 1
                    msgs = await self._fetch(sub, free)
                    for _ in range(free - len(msgs)):
                        self._slots.release()
                    for msg in msgs:
                        task = asyncio.create_task(self._process(msg))
                        self._inflight.add(task)
                        task.add_done_callback(self._done)
            except _CONNECTION_ERRORS as exc:
                if self._stopping.is_set():
                    break
                if self._note_failure(exc) == "permanent":
                    await self._pause(self.opts.permanent_retry_s)
                else:
                    log.info("handler %s: re-subscribing after %r", self.durable, exc)
                    await self._wait_connected()
            finally:
                if self._inflight:
                    await asyncio.gather(*self._inflight, return_exceptions=True)
                if sub is not None:
                    with contextlib.suppress(*_CONNECTION_ERRORS):
                        await sub.unsubscribe()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._slots.release()
        exc = None if task.cancelled() else task.exception()
        if exc is not None and self._note_failure(exc) == "transient":
            log.warning("handler %s: %r", self.durable, exc)

    def _note_failure(self, exc: BaseException) -> Severity:
        """Classify a bus failure (``bus/failures.py``); a permanent one is logged at ERROR and
        kept in ``failure`` until a message is handled again."""
        kind = severity(exc)
        if kind == "permanent":
            self.failure = f"{type(exc).__name__}: {exc}"
            log.error(
                "handler %s: %s — retrying every %.0fs, but this needs an operator",
                self.durable,
                self.failure,
                self.opts.permanent_retry_s,
            )
        return kind

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _wait_connected(self) -> None:
        reconnects = reconnects_of(self.log.nc)
        stop = asyncio.ensure_future(self._stopping.wait())
        conn = asyncio.ensure_future(reconnects.connected.wait())
        try:
            await asyncio.wait({stop, conn}, timeout=5.0, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            conn.cancel()
        await asyncio.sleep(0.1)

    async def _fetch(self, sub: JetStreamContext.PullSubscription, batch: int) -> list[Msg]:
        """One pull, interrupted by ``stop()``; an empty batch is an empty list, not an error.

        No idle heartbeat: nats-py reuses it on its follow-up request with the *remaining*
        expiry, which the server rejects as "heartbeat value too large" once little time is left
        (and the messages already delivered to that fetch wait out ``ack_wait``). A short fetch
        timeout bounds a stalled pull instead, and reconnects re-create the subscription."""
        fetch = asyncio.ensure_future(sub.fetch(batch, timeout=self.opts.fetch_timeout_s))
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            fetch.cancel()
            raise
        finally:
            stop.cancel()
        if fetch not in done:
            # stopping: messages already on their way to this pull are handled, not left to
            # time out unacked (they would be redelivered to the next instance after ack_wait)
            done, _ = await asyncio.wait({fetch}, timeout=0.25)
            if fetch not in done:
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, *_CONNECTION_ERRORS, TimeoutError):
                    await fetch
                return []
        try:
            return list(fetch.result())
        except (TimeoutError, nats.errors.TimeoutError):
            return []

    async def _process(self, msg: Msg) -> None:
        meta = msg.metadata
        try:
            # a misplaced event (bus/placement.py) raises too: dead-lettered, never handled
            event = self.log.decode(msg.data, subject=msg.subject)
        except EventDecodeError as exc:
            await self._dead_letter(msg, BusMalformed, exc.kind.value, exc.message)
            return
        if not isinstance(event, self.reactor.consumes):
            await msg.ack()
            return
        with self.tracer.start_as_current_span(
            f"{self.durable} {event.type}",
            context=context_from(event.trace),
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": msg.subject,
                "messaging.message.id": event.id,
                "nanocrab.handler": self.durable,
                "nanocrab.stream_seq": meta.sequence.stream,
                "nanocrab.run_id": event.run_id or "",
            },
        ) as span:
            keepalive = asyncio.create_task(self._keep_alive(msg))
            try:
                result = await self.reactor.handle(
                    event,
                    Delivery(meta.sequence.stream, msg.subject, meta.num_delivered or 1),
                )
            except TransientError as exc:
                keepalive.cancel()
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                await self._retry_or_give_up(msg, exc)
                return
            except Exception as exc:
                keepalive.cancel()
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, repr(exc)))
                await self._dead_letter(msg, BusDeadLettered, "poison", _describe(exc))
                return
            finally:
                keepalive.cancel()
            reaction = result if isinstance(result, Reaction) else Reaction(result)
            try:
                await self._append(event, reaction)
            except EventDecodeError as exc:  # a reaction the codec refuses (e.g. oversized)
                await self._dead_letter(msg, BusDeadLettered, "poison", f"reaction refused: {exc}")
                return
            except PublishRefused as exc:  # not this identity's to publish: retrying cannot help
                await self._dead_letter(msg, BusDeadLettered, "poison", str(exc))
                return
            await msg.ack()
        self.processed += 1
        self.failure = None

    async def _append(self, cause: Event, reaction: Reaction) -> None:
        if not await append_reaction(self.log, self.durable, cause, reaction):
            log.debug("handler %s: reaction to %s superseded by a newer event", self.durable,
                      cause.id)  # fmt: skip
            self.superseded += 1

    async def _keep_alive(self, msg: Msg) -> None:
        """In-progress acks while a reactor works longer than a third of ``ack_wait``."""
        while True:
            await asyncio.sleep(self.opts.ack_wait_s / 3)
            with contextlib.suppress(*_CONNECTION_ERRORS):
                await msg.in_progress()

    async def _retry_or_give_up(self, msg: Msg, exc: TransientError) -> None:
        delivered = msg.metadata.num_delivered or 1
        if delivered >= self.opts.max_deliver:
            await self._dead_letter(
                msg,
                BusDeadLettered,
                "max_deliveries",
                f"gave up after {delivered} deliveries: {exc}",
            )
            return
        delay = self.opts.backoff_s[min(delivered - 1, len(self.opts.backoff_s) - 1)]
        await msg.nak(delay=delay)

    async def _dead_letter(
        self,
        msg: Msg,
        kind: type[BusMalformed] | type[BusDeadLettered],
        reason_kind: DeadLetterKind,
        reason: str,
    ) -> None:
        """Record the failure as an event (idempotent per handler and stream sequence), then
        terminate the message so it is never redelivered to this handler."""
        meta = msg.metadata
        seq = meta.sequence.stream
        tokens = msg.subject.split(".")
        record = kind(
            id=derive_event_id(
                self.durable,
                f"{meta.stream}:{seq}",
                0,
                millis=int(meta.timestamp.timestamp() * 1000),
            ),
            source=self.durable,
            tenant=sanitize_token(tokens[1]) if len(tokens) == 6 else "default",
            handler=self.durable,
            stream=meta.stream,
            stream_seq=seq,
            subject=msg.subject,
            reason_kind=reason_kind,
            reason=reason[:2000],
            deliveries=meta.num_delivered or 1,
            preview=msg.data[:_PREVIEW_BYTES].decode("utf-8", "replace"),
        )
        await self.log.append(record)
        await msg.term()
        self.dead_lettered += 1
        log.warning(
            "handler %s: dead-lettered seq %s (%s): %s", self.durable, seq, reason_kind, reason
        )


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
