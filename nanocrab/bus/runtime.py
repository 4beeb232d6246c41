"""Runs a reactor on a durable pull consumer (DESIGN §5).

Per message: decode → dispatch → append reactions (pipelined, deterministic ids) → ack. The ack
comes only after JetStream acknowledged every reaction, so a crash anywhere before it leads to a
redelivery whose reactions deduplicate. Pull requests stay open across fetches (``Puller``), so
a delivery usually costs the ack alone, and the ack leaves with the connection's next message
(``bus/acks.py``: within 20 ms, and before a stopping runtime returns). With ``concurrency``
above 1, events of different runs are handled side by side and those of one run in order; a
reactor with ``admission`` types (new work) has them wait while other events are in hand or it
says not to ``admit()`` yet.
Malformed input and poison events are terminated and recorded as ``bus.malformed`` /
``bus.dead_lettered`` events (pointing at the original bytes by stream sequence); the loop goes
on with the next message. An event stored on another subject than its own
(``bus/placement.py``) is malformed input: ``bus.malformed`` with kind ``invalid``.
Transient failures are nak'd with backoff until ``max_deliver``; so is a bus failure (a read
or an append that failed or timed out, e.g. while a replicated stream elects a leader), whether
the reactor's own I/O raised it or the append of its reaction: the event was not at fault, and a
delivery is acknowledged only once its reactions are stored. The subscription is re-created
after a server restart. Bus failures are classified (``bus/failures.py``): a permanent one (a full
log, a missing stream) is logged at ERROR, kept in ``failure`` and retried slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections import OrderedDict, deque
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from nanocrab.bus.acks import deferred_acks, send_acks_first
from nanocrab.bus.connection import patiently, reconnects_of
from nanocrab.bus.durable_guard import DurableGuard
from nanocrab.bus.errors import BusError, PublishRefused, TransientError
from nanocrab.bus.failures import Severity, severity
from nanocrab.bus.log import EventLog
from nanocrab.bus.puller import CONNECTION_ERRORS as _CONNECTION_ERRORS
from nanocrab.bus.puller import Puller
from nanocrab.bus.reactions import append_reaction
from nanocrab.bus.reactor import Delivery, Reaction, Reactor, handling
from nanocrab.bus.subjects import sanitize_token
from nanocrab.bus.tracing import HandledSpan, context_from, handler_spans
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
KNOWN_RUNS = 4096
"""Runs a ``known_runs_first`` handler remembers having handled (least recently used out): a
forgotten run's next event waits as a new run's would, which costs it order, not correctness."""
_STARTUP_PATIENCE_S = 60.0
"""How long a handler's start waits for the JetStream API (a leader election, a loaded cluster)
before giving up with :class:`BusError`."""


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
    stop_grace_s: float = 0.25
    """How long a stopping handler waits for messages already sent to its open pull, which
    would otherwise be redelivered only after ``ack_wait``. A one-shot command that has seen
    its run end sets it low: it has nothing left to wait for."""
    durable_check_s: float = 2.0
    """How often the durable's configuration is compared with the runtime's, and put back when
    someone else changed it (:mod:`nanocrab.bus.durable_guard`)."""
    concurrency: int = 1
    """Events handled at once. Above 1, events of different runs are handled side by side (and
    acknowledged out of order); the events of one run are still handled one after another, in
    the order they were delivered."""


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
        self._global_tracer = tracer is None  # then the cheap handler spans, once configured
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
        self._tails: dict[str, asyncio.Task[None]] = {}  # run → its last event's task in hand
        self._admission = frozenset(getattr(reactor, "admission", ()) if self.opts.concurrency > 1
                                    else ())  # fmt: skip
        self._known_first = frozenset(getattr(reactor, "known_runs_first", ())
                                      if self.opts.concurrency > 1 else ())  # fmt: skip
        self._known: OrderedDict[str, None] = OrderedDict()  # runs handled lately (LRU)
        self._high: deque[Msg] = deque()  # fetched, not started: everything but admissions
        self._low: deque[tuple[Msg, float]] = deque()  # admissions (and their runs' events)
        self._low_runs: dict[str, int] = {}
        self._waiting_cap = max(1, self.opts.max_ack_pending // 2)
        """Deliveries held back at most: the rest of ``max_ack_pending`` stays free, so the
        server keeps delivering the events that go first."""
        self._keepalive_task: asyncio.Task[None] | None = None
        self._puller: Puller | None = None  # the subscription being fetched from (``stop()``)
        self._handling: dict[int, tuple[Msg, float]] = {}  # id(msg) → (msg, handled since)
        self._handling_task: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(self.opts.concurrency)
        self.guard: DurableGuard | None = None  # while running: who watches the durable

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
        already has (its position is kept; JetStream updates filters in place).

        Each request waits out a leader election or a busy cluster (:func:`patiently`, up to
        ``_STARTUP_PATIENCE_S``) rather than failing the handler's start on one timeout."""
        js, stream = self.log.js, self.log.cfg.log_stream
        what = f"consumer {self.durable}"
        create = partial(js.add_consumer, stream, config=self.consumer_config())
        try:
            info = await patiently(partial(js.consumer_info, stream, self.durable), what,
                                   patience_s=_STARTUP_PATIENCE_S)  # fmt: skip
        except nats.js.errors.NotFoundError:
            await patiently(create, f"creating {what}", patience_s=_STARTUP_PATIENCE_S)
            return
        current = info.config.filter_subjects or (
            [info.config.filter_subject] if info.config.filter_subject else []
        )
        if sorted(current) != sorted(self.filters):
            log.info("handler %s: updating its consumer's filters to %s", self.durable,
                     self.filters)  # fmt: skip
            await patiently(create, f"updating {what}", patience_s=_STARTUP_PATIENCE_S)

    def stop(self) -> None:
        self._stopping.set()
        if self._puller is not None:
            self._puller.stop(self.opts.stop_grace_s)

    async def run(self) -> None:
        guard = DurableGuard(
            self.log.js, self.log.cfg.log_stream, self.durable, self.consumer_config,
            partial(self.log.js.add_consumer, self.log.cfg.log_stream,
                    config=self.consumer_config()),
            interval_s=self.opts.durable_check_s,
        )  # fmt: skip
        self.guard = guard
        watching = asyncio.create_task(guard.watch(self._stopping))
        try:
            await self._run()
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)

    async def _run(self) -> None:
        reconnects = reconnects_of(self.log.nc)
        while not self._stopping.is_set():
            sub = None
            try:
                await self.ensure_consumer()
                sub = Puller(self.log, self.durable)
                await sub.start()
                generation = reconnects.generation
                while not self._stopping.is_set() and generation == reconnects.generation:
                    if self.opts.concurrency == 1:
                        for msg in await self._fetch(sub, self.opts.batch):
                            await self._process(msg)
                        continue
                    if self._admission or self._known_first:
                        await self._step_admitting(sub)
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
                        self._spawn(msg)
            except _CONNECTION_ERRORS as exc:
                if self._stopping.is_set():
                    break
                if self._note_failure(exc) == "permanent":
                    await self._pause(self.opts.permanent_retry_s)
                else:
                    log.info("handler %s: re-subscribing after %r", self.durable, exc)
                    await self._wait_connected()
            finally:
                await self._release_waiting()
                if self._inflight:
                    await asyncio.gather(*self._inflight, return_exceptions=True)
                await send_acks_first(self.log.nc)
                if self._handling_task is not None:
                    self._handling_task.cancel()
                if sub is not None:
                    await sub.close()

    async def _step_admitting(self, sub: Puller) -> None:
        """Take one free slot and start the most urgent delivery in hand, fetching more first
        when none may start.

        For a reactor with ``admission`` types (the events that start new work: a task) and an
        ``admit()`` that says whether to start more now. Deliveries of those types wait in memory
        (their acks kept alive) while everything else goes first and while ``admit()`` says no,
        so a burst of tasks does not push the runs already going to the back of every queue
        (without it a thousand tasks complete in lockstep). The events of a run keep their order:
        an event of a run whose admission is waiting waits behind it."""
        await self._slots.acquire()
        try:
            while not self._stopping.is_set():
                if self._low and not self._high:
                    # before a waiting delivery starts, what has arrived since may go first
                    await sub.ask(self.opts.batch, self.opts.fetch_timeout_s)
                    for m in sub.ready(self.opts.batch):
                        self._classify(m)
                msg = self._next_waiting()
                if msg is not None:
                    self._spawn(msg)
                    return
                # while admissions wait, only poll: they may start as soon as admit() says so
                expires = 0.02 if self._low else self.opts.fetch_timeout_s
                for m in await self._fetch(sub, self.opts.batch, expires_s=expires):
                    self._classify(m)
        except BaseException:
            self._slots.release()
            raise
        self._slots.release()

    def _classify(self, msg: Msg) -> None:
        key = _run_key(msg.subject)
        is_admission = key is not None and (
            _type_of(msg.subject) in self._admission
            or (bool(self._known_first) and key not in self._known)
        )
        if is_admission or (key is not None and self._low_runs.get(key)):
            self._low.append((msg, time.monotonic()))
            if key is not None:
                self._low_runs[key] = self._low_runs.get(key, 0) + 1
            if self._keepalive_task is None or self._keepalive_task.done():
                self._keepalive_task = asyncio.create_task(self._keep_waiting_alive())
        else:
            self._high.append(msg)

    def _next_waiting(self) -> Msg | None:
        if self._high:
            return self._high.popleft()
        if not self._low:
            return None
        admit = getattr(self.reactor, "admit", None)
        if admit is not None and not admit() and len(self._low) < self._waiting_cap:
            return None  # (past the cap they go in order: the server must keep delivering)
        msg, _ = self._low.popleft()
        key = _run_key(msg.subject)
        if key is not None:
            left = self._low_runs.get(key, 1) - 1
            if left:
                self._low_runs[key] = left
            else:
                self._low_runs.pop(key, None)
        return msg

    async def _keep_waiting_alive(self) -> None:
        """In-progress acks for deliveries waiting for admission longer than a third of
        ``ack_wait`` (else the server would hand them to another instance)."""
        while self._low:
            await asyncio.sleep(self.opts.ack_wait_s / 3)
            limit = time.monotonic() - self.opts.ack_wait_s / 3
            for msg, since in list(self._low):
                if since < limit:
                    with contextlib.suppress(*_CONNECTION_ERRORS):
                        await msg.in_progress()

    async def _release_waiting(self) -> None:
        """Hand deliveries not started back to the server (stop, reconnect): redelivered at
        once, here or to another instance."""
        waiting = [*self._high, *(m for m, _ in self._low)]
        self._high.clear()
        self._low.clear()
        self._low_runs.clear()
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
        for msg in waiting:
            with contextlib.suppress(*_CONNECTION_ERRORS):
                await msg.nak()

    def _spawn(self, msg: Msg) -> None:
        """Handle ``msg`` in a task of its own, after the events of its run already in hand:
        concurrency is across runs, never within one (a run's events keep the log's order)."""
        key = _run_key(msg.subject)
        if self._known_first and key is not None and _type_of(msg.subject) in self._known_first:
            self._known[key] = None
            self._known.move_to_end(key)
            if len(self._known) > KNOWN_RUNS:
                self._known.popitem(last=False)
        before = self._tails.get(key) if key is not None else None
        task = asyncio.create_task(self._process_after(before, msg))
        self._inflight.add(task)
        task.add_done_callback(self._done)
        if key is not None:
            self._tails[key] = task
            task.add_done_callback(lambda t: self._untail(key, t))

    def _untail(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tails.get(key) is task:
            del self._tails[key]

    async def _process_after(self, before: asyncio.Task[None] | None, msg: Msg) -> None:
        if before is not None:
            await asyncio.wait({before})  # its outcome is its own; only the order matters here
        await self._process(msg)

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

    async def _fetch(self, sub: Puller, batch: int, *, expires_s: float | None = None) -> list[Msg]:
        """One pull, cut short by ``stop()`` (then only what arrives within ``stop_grace_s``:
        messages already on their way to this pull are handled, not left to time out unacked,
        which would redeliver them to the next instance after ``ack_wait``); an empty batch is
        an empty list, not an error. A short expiry (no idle heartbeat) bounds a stalled pull,
        and reconnects re-create the subscription."""
        self._puller = sub
        if self._stopping.is_set():
            sub.stop(self.opts.stop_grace_s)
        return await sub.fetch(batch, expires_s or self.opts.fetch_timeout_s)

    def _span(
        self, event: Event, subject: str, seq: int
    ) -> AbstractContextManager[HandledSpan | Span]:
        """The span of handling ``event``, current while it is handled: made by the cheap
        :class:`~nanocrab.bus.tracing.HandlerSpans` that ``configure_tracing`` installed, or by
        the SDK tracer given to this runtime (tests) or the global one (tracing set up otherwise,
        or off)."""
        name = f"{self.durable} {event.type}"
        attributes: dict[str, AttributeValue] = {
            "messaging.system": "nats",
            "messaging.destination.name": subject,
            "messaging.message.id": event.id,
            "nanocrab.handler": self.durable,
            "nanocrab.stream_seq": seq,
            "nanocrab.run_id": event.run_id or "",
        }
        fast = handler_spans() if self._global_tracer else None
        if fast is not None:
            return fast.span(name, event.trace, attributes)
        return self.tracer.start_as_current_span(
            name, context=context_from(event.trace), kind=SpanKind.CONSUMER, attributes=attributes
        )

    async def _process(self, msg: Msg) -> None:
        meta = msg.metadata
        try:
            # a misplaced event (bus/placement.py) raises too: dead-lettered, never handled
            event = self.log.decode(msg.data, subject=msg.subject)
        except EventDecodeError as exc:
            await self._dead_letter(msg, BusMalformed, exc.kind.value, exc.message)
            return
        if not isinstance(event, self.reactor.consumes):
            deferred_acks(self.log.nc).add(msg)
            return
        with self._span(event, msg.subject, meta.sequence.stream) as span:
            self._handling_since(msg)
            delivery = Delivery(meta.sequence.stream, msg.subject, meta.num_delivered or 1)
            token = handling.set(delivery)
            try:
                result = await self.reactor.handle(event, delivery)
            except TransientError as exc:
                self._handled(msg)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                await self._retry_or_give_up(msg, exc)
                return
            except Exception as exc:
                self._handled(msg)
                if _bus_failure(exc):  # the bus failed the handler (a read timed out while a
                    # stream elected a leader), not the event: retried, or waited out if lasting
                    span.set_status(Status(StatusCode.ERROR, repr(exc)))
                    await self._bus_failed(msg, exc)
                    return
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, repr(exc)))
                await self._dead_letter(msg, BusDeadLettered, "poison", _describe(exc))
                return
            finally:
                self._handled(msg)
                handling.reset(token)
            reaction = result if isinstance(result, Reaction) else Reaction(result)
            if not reaction.events and isinstance(span, HandledSpan):
                span.quiet = True  # exported only if it took long (HandlerSpans)
            try:
                await self._append(event, reaction)
            except EventDecodeError as exc:  # a reaction the codec refuses (e.g. oversized)
                await self._dead_letter(msg, BusDeadLettered, "poison", f"reaction refused: {exc}")
                return
            except PublishRefused as exc:  # not this identity's to publish: retrying cannot help
                await self._dead_letter(msg, BusDeadLettered, "poison", str(exc))
                return
            except _RETRYABLE as exc:  # not stored, or not known to be: never acknowledged
                span.set_status(Status(StatusCode.ERROR, repr(exc)))
                await self._bus_failed(msg, exc)
                return
            deferred_acks(self.log.nc).add(msg)  # after the append, sent with the next message
        self.processed += 1
        self.failure = None

    async def _append(self, cause: Event, reaction: Reaction) -> None:
        if not await append_reaction(self.log, self.durable, cause, reaction):
            log.debug("handler %s: reaction to %s superseded by a newer event", self.durable,
                      cause.id)  # fmt: skip
            self.superseded += 1

    def _handling_since(self, msg: Msg) -> None:
        """Note that the reactor works on ``msg`` from now (:meth:`_keep_handling_alive`)."""
        self._handling[id(msg)] = (msg, time.monotonic())
        if self._handling_task is None or self._handling_task.done():
            self._handling_task = asyncio.create_task(self._keep_handling_alive())

    def _handled(self, msg: Msg) -> None:
        self._handling.pop(id(msg), None)

    async def _keep_handling_alive(self) -> None:
        """In-progress acks for the deliveries a reactor has worked on longer than a third of
        ``ack_wait`` (each is told at most two thirds of ``ack_wait`` after it started). One
        task for all of them while any is in hand: a task per delivery, made and cancelled
        around every ``handle()``, cost the loop two steps and a timer per event."""
        period = self.opts.ack_wait_s / 3
        while self._handling:
            await asyncio.sleep(period)
            limit = time.monotonic() - period
            for msg, since in list(self._handling.values()):
                if since < limit:
                    with contextlib.suppress(*_CONNECTION_ERRORS):
                        await msg.in_progress()

    async def _bus_failed(self, msg: Msg, exc: Exception) -> None:
        """A bus failure while handling ``msg`` (a read or an append): a transient one has the
        delivery retried with backoff, like a :class:`TransientError`; a permanent one (a full
        log) goes up to :meth:`run`, which records it and pauses (``msg`` is redelivered after
        ``ack_wait``)."""
        if severity(exc) == "permanent":
            raise exc
        log.warning("handler %s: retrying seq %s after %r", self.durable,
                 msg.metadata.sequence.stream, exc)  # fmt: skip
        await self._retry_or_give_up(msg, exc)

    async def _retry_or_give_up(self, msg: Msg, exc: Exception) -> None:
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


def _type_of(subject: str) -> str:
    """An event's type from its subject (its last two tokens)."""
    return ".".join(subject.rsplit(".", 2)[-2:])


def _run_key(subject: str) -> str | None:
    """The run an event's subject is about (``<root>.<tenant>.run.<id>.<family>.<name>``)."""
    tokens = subject.split(".")
    if len(tokens) == 6 and tokens[2] == "run":
        return f"{tokens[1]}.{tokens[3]}"
    return None


_RETRYABLE = (BusError, nats.errors.Error)
"""Failures of the bus, as opposed to the event: the delivery is retried with backoff (and
dead-lettered only if the bus is still failing after ``max_deliver`` deliveries)."""


def _bus_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a reactor, is a failure of the bus it reads and appends
    through rather than of the event (:class:`PublishRefused` is a wiring bug: poison)."""
    return isinstance(exc, _RETRYABLE) and not isinstance(exc, PublishRefused)


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
