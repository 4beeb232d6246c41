"""Session history for the LLM handler, folded from the log in memory (no waiting on SQL).

A session spans many runs; a new task's model call starts with the session's earlier messages:
the task texts, steer / follow-up messages and replies of its top-level runs. ``/new`` archives a
session (``session.archived``): from then on it feeds no history. A branch
(``session.branched``) starts with its parent's history up to the fork event
(``handlers/branches.py``). The ``sessions`` projection folds the same events into SQL
(``projections/sessions.py``; a test keeps the two in agreement).

Freshness, the guarantee this exists for: one ordered consumer, filtered to those four event
types, folds them into the sessions the index holds and advances ``position`` (the stream
sequence of the last message it folded). The history of the task stored at sequence T is
answered only once ``position >= T``: the task's own ``task.submitted`` passes the filter and
delivery is in stream order, so every earlier message of the session has been folded. A task
submitted right after the previous run's reply therefore sees that reply — no polling, and no
read model to wait for. The answer is the session's messages stored before T, so a run's history
is fixed (later runs of the session never leak into it).

Bounded memory (``bench/soak.py``): at most ``capacity`` sessions (least recently used out), each
its newest ``limit + SLACK`` messages. A session not held (new to this process, or evicted) is
loaded once, up to the current position: the ``sessions`` projection's rows up to its checkpoint
when a snapshot source is given, then the log from there (batched direct gets per event type),
while live messages of that session already fold into the entry being loaded. Without a snapshot
source (no SQL in this process) the log alone is read. A top-level ``task.submitted`` of a
session not held starts that load as it arrives, so it overlaps with the orchestrator starting
the run instead of delaying the first model call (at most ``capacity // 4`` loads at once).

Loading a session reads only what the index cannot vouch for: ``_seen`` holds, for every
session with a history event folded in ``(horizon, position]``, the sequences of its first and
last such event (least recently seen out, the evicted one's last sequence raising ``horizon``).
A session not in ``_seen`` (or first seen after ``up_to``) has nothing in ``(horizon, up_to]``
when ``up_to <= position``, so the log is read only over ``(snapshot, min(horizon, up_to)]`` —
not at all once the projection's checkpoint has passed the horizon, the usual case for a
brand-new session, whose load then costs one SQL read instead of the log's pages of every
session since the checkpoint. A session that is in ``_seen`` has its history events after the
horizon between its first and last sequence there (verdicts that change a message's text
included), so past the horizon only that stretch is read — in a burst of new sessions the
projection lags and every load used to read all sessions' events since its checkpoint (a
session's own history event comes before its first model call's load: it is always seen).

If the consumer falls behind (more than ``wait_s``), or a session holds too few messages to
answer, that one request reads the same way up to T, uncached: slower, never stale. After a
reconnect the consumer and the entries are rebuilt, since an ordered consumer may not survive
one (nats.py issue #504).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from nanocrab.bus import BusError, EventLog, TransientError
from nanocrab.bus.connection import reconnects_of
from nanocrab.bus.direct import DirectReader
from nanocrab.bus.replay import position
from nanocrab.events import (
    Event,
    EventDecodeError,
    GuardrailChecked,
    MessageQueued,
    ReplySent,
    SessionArchived,
    TaskSubmitted,
    screened_message,
)
from nanocrab.handlers.branches import Branches, join
from nanocrab.handlers.conversation import history_messages
from nanocrab.llm.base import Message

HISTORY_TYPES = (
    "task.submitted", "message.queued", "reply.sent", "session.archived", "guardrail.checked",
)  # fmt: skip
"""The event types a session's history is made of (the index's consumer filter); a
``task_input`` verdict that redacted or blocked a message replaces its text
(:func:`~nanocrab.events.screened_message`)."""

CAPACITY = 256
"""Sessions an index keeps (least recently used first out); an evicted one is loaded again."""

LIMIT = 200
"""Messages of history a task gets at most (the newest)."""

SLACK = 64
"""Messages kept beyond ``LIMIT`` per session, for those stored after a task still in flight."""

SEEN = 4096
"""Sessions whose first and last history event since ``horizon`` an index remembers."""

_BUS_ERRORS = (BusError, nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError)


class Snapshot(Protocol):
    """A session as a read model held it at ``position`` (see ``session_snapshot``)."""

    @property
    def position(self) -> int: ...
    @property
    def archived(self) -> bool: ...
    @property
    def rows(self) -> Sequence[tuple[int, str, str, str, str, bool]]:
        """``(seq, event_id, run_id, role, text, judged)``, oldest first, all at or below
        ``position``; ``judged``: a ``task_input`` verdict on the message was folded."""
        ...


class SnapshotSource(Protocol):
    """Reads one session up to ``up_to`` at most (its newest ``limit`` rows)."""

    def __call__(
        self, session_id: str, *, tenant: str, up_to: int, limit: int
    ) -> Awaitable[Snapshot]: ...


@dataclass(frozen=True, slots=True)
class Said:
    """One message of a session: where it is in the log, whose run, who said what."""

    seq: int
    event_id: str
    run_id: str
    role: str
    text: str
    judged: bool = False  # a task_input verdict on it is folded: a later one changes nothing


Key = tuple[str, str]
"""A session as the index holds it: (tenant, session id). Session ids are chosen by whoever
submits a task, so two tenants may use the same one; each sees only its own history."""


def said(event: Event, seq: int) -> Said | None:
    """The history message ``event`` is, if any: what the ``sessions`` projection stores."""
    if not event.session_id or not event.run_id:
        return None
    match event:
        case TaskSubmitted(text=text) if not event.parent_run_id and not text.startswith("/"):
            role = "user"
        case MessageQueued(text=text):
            role = "user"
        case ReplySent(text=text):
            role = "assistant"
        case _:
            return None
    return Said(seq, event.id, event.run_id, role, text)


def archives(event: Event) -> bool:
    return isinstance(event, SessionArchived) and bool(event.session_id and event.run_id)


@dataclass(slots=True)
class SessionEntry:
    """What an index knows of one session: its newest messages in log order, each event once."""

    keep: int
    messages: list[Said] = field(default_factory=list)
    archived_at: int | None = None
    """Sequence of its first ``session.archived``; 0 when a snapshot said so (no sequence)."""
    complete: bool = True
    """No older message was dropped: ``messages`` is the whole session."""
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    failed: bool = False
    screened: dict[str, GuardrailChecked] = field(default_factory=dict)
    """Message event id → the first ``task_input`` verdict on it, kept for messages folded or
    loaded after their verdict. The first verdict stands, as in the run's own state: a later
    one (an identity replaying ``guardrail.checked`` after the run) rewrites no one's words."""

    def add(self, message: Said) -> None:
        """Fold a message stored after everything held (a second copy of an event: nothing)."""
        if any(m.event_id == message.event_id for m in self.messages):
            return
        verdict = self.screened.get(message.event_id)
        if not message.judged and verdict is not None:
            message = _judged(message, verdict)
        self.messages.append(message)
        if len(self.messages) > self.keep:
            del self.messages[0]
            self.complete = False

    def screen(self, verdict: GuardrailChecked) -> None:
        """A ``task_input`` verdict on message ``verdict.target_id``: its text is what the
        verdict leaves of it from now on, wherever held — unless an earlier verdict on it was
        folded."""
        event_id = verdict.target_id
        if event_id in self.screened:
            return
        held = next((m for m in self.messages if m.event_id == event_id), None)
        if held is not None and held.judged:
            return
        self.screened[event_id] = verdict
        self.messages = [_judged(m, verdict) if m.event_id == event_id else m
                         for m in self.messages]  # fmt: skip

    def archive(self, seq: int) -> None:
        if self.archived_at is None or seq < self.archived_at:
            self.archived_at = seq

    def prepend(self, older: SessionEntry) -> None:
        """Put what was loaded up to some sequence before what was folded live after it."""
        live, self.messages = self.messages, []
        for m in (*older.messages, *live):
            self.add(m)
        self.complete = self.complete and older.complete
        if older.archived_at is not None:
            self.archive(older.archived_at)

    def history(
        self, before_seq: int, run_id: str, limit: int, *, archived: bool = True
    ) -> list[tuple[str, str]] | None:
        """The newest ``limit`` messages stored before ``before_seq`` outside run ``run_id``;
        ``None`` when messages dropped from this entry may be among them. ``archived=False``
        ignores a ``/new`` (a branch forked before it still shares what came before)."""
        if archived and self.archived_at is not None and self.archived_at < before_seq:
            return []
        found = [m for m in self.messages if m.seq < before_seq and m.run_id != run_id]
        if len(found) < limit and not self.complete:
            return None
        return [(m.role, m.text) for m in found[-limit:]]


class SessionIndex:
    """A :data:`~nanocrab.handlers.llm.SessionHistory`: call it with (session id, run id, the
    task's sequence). One per process is enough; it needs no projector in the process."""

    def __init__(
        self,
        log: EventLog,
        *,
        snapshot: SnapshotSource | None = None,
        capacity: int = CAPACITY,
        limit: int = LIMIT,
        wait_s: float = 5.0,
    ) -> None:
        self.log = log
        self.snapshot = snapshot
        self.capacity = capacity
        self.limit = limit
        self.keep = limit + SLACK
        self.wait_s = wait_s
        self.position = 0
        """Stream sequence of the last message folded: nothing at or below it is missing."""
        self.horizon = 0
        """Every session with a history event in ``(horizon, position]`` is in ``_seen``."""
        self._seen: OrderedDict[Key, tuple[int, int]] = OrderedDict()
        self.log_reads = 0
        """Loads that read the log (the rest were answered by the snapshot and ``_seen``)."""
        self.reader = DirectReader(log.nc, log.cfg.log_stream, leader_only=not log.direct)
        self.branches = Branches(log, self.reader, capacity=capacity)
        self._cache: OrderedDict[Key, SessionEntry] = OrderedDict()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._prefetching: set[asyncio.Task[None]] = set()
        self._sub: JetStreamContext.PushSubscription | None = None
        self._generation = -1
        self._lock = asyncio.Lock()
        self._filters = [log.subjects.of_type(t) for t in HISTORY_TYPES]

    async def __call__(
        self, session_id: str, run_id: str, before_seq: int, *, tenant: str = "default"
    ) -> list[Message]:
        """The session's messages stored before ``before_seq`` (oldest first), as model
        messages; empty once the session was archived before it. Only ``tenant``'s: another
        tenant's session of the same id is another session."""
        return await self._history((tenant, session_id), run_id, before_seq, archived=True)

    async def shared(
        self, session_id: str, run_id: str, before_seq: int, *, tenant: str = "default"
    ) -> list[Message]:
        """A branch's parent's messages up to its fork: as :meth:`__call__`, archived or not."""
        return await self._history((tenant, session_id), run_id, before_seq, archived=False)

    async def _history(
        self, key: Key, run_id: str, before_seq: int, *, archived: bool
    ) -> list[Message]:
        if before_seq <= 1:
            return []
        tenant, session_id = key
        try:
            await self._follow()
            rows = None
            if await self._reach(before_seq):
                entry = await self._entry(key)
                rows = entry.history(before_seq, run_id, self.limit, archived=archived)
            if rows is None:  # the consumer is late, or the entry dropped what this needs
                entry = await self._load(key, up_to=before_seq - 1)
                rows = entry.history(before_seq, run_id, self.limit, archived=archived) or []
            # a branch: the parent's history up to the fork first (handlers/branches.py)
            shared = await self.branches.history(
                session_id, before_seq, partial(self.shared, tenant=tenant), tenant=tenant
            )
        except _BUS_ERRORS as exc:
            raise TransientError(f"session history of {session_id}: {exc!r}") from exc
        return join(shared, history_messages(rows)) if shared else history_messages(rows)

    def cached(self) -> list[str]:
        """The session ids held (of every tenant)."""
        return [session_id for _, session_id in self._cache]

    async def close(self) -> None:
        async with self._lock:
            await self._unsubscribe()
        for task in list(self._prefetching):
            task.cancel()
        await asyncio.gather(*self._prefetching, return_exceptions=True)

    async def _follow(self) -> None:
        """Subscribe from the end of the log, once per connection generation."""
        generation = reconnects_of(self.log.nc).generation
        if self._sub is not None and generation == self._generation:
            return
        async with self._lock:
            generation = reconnects_of(self.log.nc).generation
            if self._sub is not None and generation == self._generation:
                return
            await self._unsubscribe()
            self._cache.clear()  # folded on a consumer that may have lost messages
            start = await self.log.stream_last_seq() + 1
            self.position = max(self.position, start - 1)
            self._seen.clear()
            self.horizon = self.position
            self._sub = await self.log.js.subscribe(
                self._filters[0],
                stream=self.log.cfg.log_stream,
                cb=self._on_msg,
                ordered_consumer=True,
                idle_heartbeat=2.0,
                config=ConsumerConfig(
                    filter_subjects=self._filters,
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=start,
                ),
                pending_msgs_limit=1_000_000,
                pending_bytes_limit=256 * 1024 * 1024,
            )
            self._generation = generation
            self._wake()

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(*_BUS_ERRORS):
                await sub.unsubscribe()

    async def _on_msg(self, msg: Msg) -> None:
        seq = position(msg).stream_seq
        if seq <= self.position:
            return  # an ordered consumer re-created from an earlier sequence
        try:
            event: Event | None = self.log.decode(msg.data, subject=msg.subject)
        except EventDecodeError:
            event = None  # not history; the handlers' dead-letter path records it
        if event is not None and event.session_id:
            key = (event.tenant, event.session_id)
            if said(event, seq) is not None or archives(event) or _screens(event):
                self._see(key, seq)
            entry = self._cache.get(key)
            if entry is None and isinstance(event, TaskSubmitted) and said(event, seq):
                self._prefetch(key)
                entry = self._cache.get(key)
            if entry is not None:
                _fold(entry, event, seq)
        self.position = seq
        if self._waiters:
            self._wake()

    def _see(self, key: Key, seq: int) -> None:
        first, _ = self._seen.pop(key, (seq, seq))
        self._seen[key] = (first, seq)
        while len(self._seen) > SEEN:
            _, (_, last) = self._seen.popitem(last=False)
            self.horizon = max(self.horizon, last)

    def _to_read(self, key: Key, after: int, up_to: int) -> tuple[int, int] | None:
        """The part ``(lo, hi]`` of the log a load of the session up to ``up_to`` must read
        past a snapshot at ``after`` (``None``: nothing). Up to ``horizon`` the index cannot
        tell; after it, the session's history events all lie between the first and the last
        ``_seen`` recorded (none at all when it is not there)."""
        if up_to > self.position:
            return (after, up_to) if after < up_to else None
        first, last = self._seen.get(key, (up_to + 1, 0))
        if last > up_to:
            last = up_to
        if first > last:
            lo, hi = after, min(self.horizon, up_to)  # nothing of it after the horizon
        elif after >= self.horizon:
            lo, hi = max(after, first - 1), last  # only its own stretch of the log
        else:
            lo, hi = after, last  # before the horizon too: one read from the snapshot on
        return (lo, hi) if lo < hi else None

    def _wake(self) -> None:
        still = []
        for seq, waiter in self._waiters:
            if seq <= self.position and not waiter.done():
                waiter.set_result(None)
            elif not waiter.done():
                still.append((seq, waiter))
        self._waiters = still

    async def _reach(self, seq: int) -> bool:
        """Wait (up to ``wait_s``) until everything up to ``seq`` has been folded."""
        if self.position >= seq:
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((seq, waiter))
        try:
            await asyncio.wait_for(waiter, self.wait_s)
        except TimeoutError:
            self._waiters = [(s, w) for s, w in self._waiters if w is not waiter]
            return False
        return self.position >= seq

    async def _entry(self, key: Key) -> SessionEntry:
        """The session's entry, loading it up to the current position if not held."""
        entry = self._cache.get(key)
        if entry is not None:
            self._cache.move_to_end(key)
            await entry.ready.wait()
            if not entry.failed:
                return entry
            return await self._entry(key)  # its load failed: try once more, ourselves
        entry, base = self._open(key)
        await self._fill(key, entry, base)
        return entry

    def _open(self, key: Key) -> tuple[SessionEntry, int]:
        """A new entry, held from now on: live messages after ``base`` fold into it while what
        came up to ``base`` is loaded."""
        entry = SessionEntry(self.keep)
        self._cache[key] = entry
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return entry, self.position

    async def _fill(self, key: Key, entry: SessionEntry, base: int) -> None:
        try:
            entry.prepend(await self._load(key, up_to=base))
        except BaseException:
            entry.failed = True  # whoever waits on it loads the session again, itself
            if self._cache.get(key) is entry:
                del self._cache[key]
            raise
        finally:
            entry.ready.set()

    def _prefetch(self, key: Key) -> None:
        """Start loading a session whose task just arrived, so its first model call finds it
        held (the load overlaps with the orchestrator starting the run)."""
        if len(self._prefetching) >= self.capacity // 4:
            return  # a burst of new sessions: the model calls load them on demand
        entry, base = self._open(key)
        task = asyncio.create_task(self._fill(key, entry, base))
        self._prefetching.add(task)
        task.add_done_callback(self._prefetched)

    def _prefetched(self, task: asyncio.Task[None]) -> None:
        self._prefetching.discard(task)
        if not task.cancelled():
            task.exception()  # seen: the entry is marked failed and loaded again on demand

    async def _load(self, key: Key, *, up_to: int) -> SessionEntry:
        """The session up to stream sequence ``up_to``: the snapshot's rows, then the log."""
        tenant, session_id = key
        entry = SessionEntry(self.keep)
        entry.ready.set()
        after = 0
        if self.snapshot is not None:
            snap = await self.snapshot(session_id, tenant=tenant, up_to=up_to, limit=self.keep)
            after = snap.position
            for seq, event_id, run_id, role, text, judged in snap.rows:
                entry.add(Said(seq, event_id, run_id, role, text, judged))
            entry.complete = len(snap.rows) < self.keep
            if snap.archived:
                entry.archive(0)
        part = self._to_read(key, after, up_to)
        if part is not None:
            self.log_reads += 1
            for seq, event in await self._read(*part):
                if event.session_id == session_id and event.tenant == tenant:
                    _fold(entry, event, seq)
        return entry

    async def _read(self, after: int, up_to: int) -> list[tuple[int, Event]]:
        """The history events stored in ``(after, up_to]``, in log order (every session's)."""
        pages = await asyncio.gather(
            *(self.reader.after(f, after, up_to=up_to) for f in self._filters)
        )
        out = []
        for raw in sorted((m for page in pages for m in page), key=lambda m: m.seq):
            try:
                out.append((raw.seq, self.log.decode(raw.data, subject=raw.subject)))
            except EventDecodeError:
                continue
        return out


def _screens(event: Event) -> bool:
    """A verdict on a message's text in history (folded like one, so ``_seen`` counts it: a
    load must read it when it lands after the message)."""
    return isinstance(event, GuardrailChecked) and event.checkpoint == "task_input"


def _fold(entry: SessionEntry, event: Event, seq: int) -> None:
    message = said(event, seq)
    if message is not None:
        entry.add(message)
    elif archives(event):
        entry.archive(seq)
    elif _screens(event):
        assert isinstance(event, GuardrailChecked)
        entry.screen(event)


def _judged(message: Said, verdict: GuardrailChecked) -> Said:
    """``message`` as ``verdict`` leaves it (:func:`~nanocrab.events.screened_message`)."""
    text = screened_message(verdict, message.text)
    return dataclasses.replace(message, text=message.text if text is None else text, judged=True)
