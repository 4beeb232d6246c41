"""Per-run state kept in memory and brought up to date from the log before every decision.

Handlers see the events of a run interleaved with everything else, possibly split between
instances. Before deciding, a handler asks for the run's state, which is always a whole prefix of
the run's log that contains the event being handled — never a guess from the events this instance
happened to see.

The events come from one :class:`RunFeed` per process (shared by every handler's loader): one
ordered consumer on every run's durable events keeps the runs it knows current, in log order. A
run it does not know yet is read once with a batched direct get (``after(seq)``); from then on
the feed keeps it. While a handler handles the event at stream sequence ``s`` (the runtime's
:data:`~nanocrab.bus.reactor.handling`), the feed's position at or past ``s`` proves the run is
complete up to that event, so no read is needed; if the feed lags (or is down), the loader reads
the gap from the log as before. Without a delivery in hand (a watchdog, a recovery scan) it always
reads up to the newest event. Each loader folds the shared events into its own
:class:`RunState` (with its own ``trust``).

A run's first ``task.submitted`` reaches the feed about when it reaches the orchestrator, which
must then read the new run before it can decide to start it: so the feed starts that read as
the task arrives (at most :data:`PREFETCHES` at once), and a loader asking for the run meanwhile
waits for it instead of reading again. The read is the same one a loader would make (merged with
what the feed delivers while it is in flight); only its start is earlier.

Stored bytes become events through ``EventLog.decode``: an event stored on another subject than
its own (``bus/placement.py``: a forged type on an identity's own subject) is never folded; it is
kept in ``RunState.rejected``, and :func:`report_rejected` records each such event once as
``security.rejected`` (the policy and the executor call it; handlers that consume its subject
dead-letter it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from nanocrab.bus import EventLog, TransientError, sanitize_token, stamp
from nanocrab.bus.direct import DirectReader
from nanocrab.bus.log import RawMessage
from nanocrab.bus.placement import Misplaced
from nanocrab.bus.reactor import handling
from nanocrab.events import (
    RUN_ENDS,
    Event,
    EventDecodeError,
    SecurityRejected,
    derive_event_id,
)
from nanocrab.handlers.runstate import Rejected, RunState, Trust

log = logging.getLogger(__name__)

_MAX_ULID_MILLIS = (1 << 48) - 1


CAPACITY = 256
"""Run states a loader keeps (least recently used first out). A cache, not memory: an evicted
run is folded again from the log when next needed, so the bound costs reads, never correctness;
it keeps a long-lived process's memory flat (bench/soak.py)."""

FEED_CAPACITY = 2048
"""Runs the process-wide feed keeps events of (least recently used first out); like
:data:`CAPACITY` a bound that costs reads, never correctness. A burst of a thousand tasks
touches every run at once (the guardrails check each task as it arrives, before the orchestrator
admits it), so the feed holds that many live runs: at 512 it evicted runs between their first
read and their start, and every read again was a direct get the server answers by scanning the
log between the run's events — nats-server CPU per run 2.5 times that at 100 in flight
(``bench/throughput.py --burst 1000`` prints both). Runs that ended are kept apart and few
(:data:`ENDED_CAPACITY`, as many as the feed held in all before), so beyond that the memory held
is that of the runs in flight (bench/soak.py)."""

ENDED_CAPACITY = 512
"""Runs that ended (``run.completed``, ``run.failed``, ``run.cancelled``) the feed keeps for the
few events that follow an end (a grant's revocation, a late verdict); the oldest go first."""


PREFETCHES = 32
"""New runs' reads the feed starts on its own at once; beyond, the loaders read on demand."""

_BEHIND_BACKOFF_S = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Waits between re-reads of a run a lagging replica answered short (about 2 s in all)."""

Entry = tuple[int, Event | None, str | None]
"""A stored event of a run: ``(seq, event, None)`` to fold, ``(seq, event, reason)`` for one not
to believe (misplaced), ``(seq, None, None)`` for bytes that are not an event (skipped: recorded
as a dead letter by the handlers, not state)."""


@dataclass
class _RunLog:
    """What the feed holds of one run: every stored event of it up to ``seq``, in order."""

    entries: list[Entry] = field(default_factory=list)
    seq: int = 0
    ended: bool = False

    def add(self, entry: Entry) -> None:
        if entry[0] > self.seq:
            self.entries.append(entry)
            self.seq = entry[0]
            event = entry[1]
            if event is not None and entry[2] is None and event.type in RUN_ENDS:
                self.ended = True

    def after(self, seq: int) -> list[Entry]:
        if seq >= self.seq:
            return []
        i = len(self.entries)
        while i > 0 and self.entries[i - 1][0] > seq:
            i -= 1
        return self.entries[i:]


class RunFeed:
    """Every durable event of every run, in log order, for the handlers of one process.

    Invariant: a run in ``_runs`` holds every event of that run stored up to ``max(position,
    run.seq)``. A run enters only through a direct read, merged with what the feed delivered
    while the read was in flight; the ordered consumer then delivers every later event of every
    run in order (``position`` is the stream sequence of the last one). Anything that could break
    the chain (a consumer reset, a gap in its sequence, a lost subscription) forgets every run.
    """

    def __init__(
        self, log: EventLog, *, capacity: int = FEED_CAPACITY, wait_s: float = 0.05
    ) -> None:
        self.log = log
        self.loop = asyncio.get_running_loop()
        self.reader = DirectReader(log.nc, log.cfg.log_stream, leader_only=not log.direct)
        self.capacity = capacity
        self.wait_s = wait_s
        self.position = 0
        self.live = False
        self.reads = 0
        """Direct reads so far (a measure of how often the feed could not answer)."""
        self.stale_reads = 0
        """Direct reads a replica answered short of an event known to be stored (re-read)."""
        self._runs: OrderedDict[str, _RunLog] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()
        """Keys of the held runs that ended, oldest end first (evicted before live runs)."""
        self._loading: dict[str, list[Entry]] = {}
        self._loaders: dict[str, int] = {}
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()
        self._epoch = 0
        self._consumer_seq = 0
        self._stalled_at = -1
        self._next_attempt = 0.0
        self._starting: asyncio.Lock | None = None
        self._sub: object | None = None
        self._prefetching: dict[str, asyncio.Future[list[Entry]]] = {}

    # -- the subscription ---------------------------------------------------------------------

    async def _ensure_started(self) -> None:
        if self.live or time.monotonic() < self._next_attempt or self.log.nc.is_closed:
            return
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self.live:
                return
            self._next_attempt = time.monotonic() + 5.0
            try:
                self._sub = await self.log.js.subscribe(
                    f"{self.log.cfg.root}.*.run.*.*.*",
                    stream=self.log.cfg.log_stream,
                    cb=self._on_msg,
                    ordered_consumer=True,
                    deliver_policy=DeliverPolicy.NEW,
                    pending_msgs_limit=1_000_000,
                )
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                log.info("run feed unavailable (reading the log instead): %r", exc)
                return
            self._forget_all()
            self.live = True

    def _forget_all(self) -> None:
        self._runs.clear()
        self._ended.clear()
        self._epoch += 1
        self._consumer_seq = 0

    async def _on_msg(self, msg: Msg) -> None:
        try:
            meta = msg.metadata
        except Exception:  # not a consumer delivery (a status message)
            return
        seq, consumer_seq = int(meta.sequence.stream), int(meta.sequence.consumer)
        if consumer_seq != self._consumer_seq + 1:
            # a reset or a gap: what the feed holds may miss events, so it holds nothing
            self._forget_all()
        self._consumer_seq = consumer_seq
        key = msg.subject.split(".")[3]
        run = self._runs.get(key)
        loading = self._loading.get(key)
        if run is not None or loading is not None:
            entry = self._entry(seq, msg.subject, msg.data)
            if run is not None:
                run.add(entry)
                if run.ended and key not in self._ended:
                    self._held(key, run)
            if loading is not None:
                loading.append(entry)
        elif msg.subject.endswith(".task.submitted") and len(self._prefetching) < PREFETCHES:
            self._prefetch(key, seq)
        self.position = max(self.position, seq)
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.position:
            _, _, future = heapq.heappop(waiters)
            if not future.done():
                future.set_result(None)

    def _entry(self, seq: int, subject: str, data: bytes) -> Entry:
        try:
            return (seq, self.log.decode(data, subject=subject), None)
        except Misplaced as exc:
            return (seq, exc.event, exc.message)
        except EventDecodeError:
            return (seq, None, None)

    def _prefetch(self, key: str, seq: int) -> None:
        """Start reading run ``key`` (a token: ``subjects.run`` of it is the run's scope), whose
        ``task.submitted`` is at ``seq``: the read must reach it."""
        if key in self._prefetching:
            return
        task = asyncio.ensure_future(self._read(key, key, 0, need=seq))
        self._prefetching[key] = task
        task.add_done_callback(lambda t: self._prefetched(key, t))

    def _prefetched(self, key: str, task: asyncio.Future[list[Entry]]) -> None:
        if self._prefetching.get(key) is task:
            del self._prefetching[key]
        if not task.cancelled() and task.exception() is not None:
            log.debug("run feed: prefetch of %s failed: %r", key, task.exception())

    # -- reading ------------------------------------------------------------------------------

    async def entries(self, run_id: str, after: int) -> list[Entry]:
        """The run's stored events after ``after``, up to at least the event being handled (when
        it is this run's) or else the newest one in the log."""
        await self._ensure_started()
        key = sanitize_token(run_id)
        prefetch = self._prefetching.get(key)
        if prefetch is not None:
            await asyncio.wait([prefetch])  # its outcome is seen below: the run held, or not
        at = _handled_seq(self.log, key)
        if at is not None and self.live:
            run = self._runs.get(key)
            if run is not None and (at <= max(run.seq, self.position) or await self._reach(at)):
                run = self._runs.get(key)  # still held (not forgotten while waiting)?
                if run is not None:
                    self._runs.move_to_end(key)
                    return run.after(after)
        return await self._read(run_id, key, after, need=at or 0)

    async def _reach(self, seq: int) -> bool:
        """Wait (bounded) until the feed has delivered ``seq``; ``False`` when it did not."""
        if self._stalled_at == self.position:
            return False  # it timed out here before and has not moved since
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._ids), future))
        try:
            await asyncio.wait_for(future, self.wait_s)
            return True
        except TimeoutError:
            self._stalled_at = self.position
            return False

    async def _read(self, run_id: str, key: str, after: int, *, need: int = 0) -> list[Entry]:
        """Read what the feed does not hold of the run, and keep the run from then on. ``need``:
        the stream sequence of an event of this run known to be stored (the one being handled,
        or the task that started a prefetch); the read is not done before it reaches it."""
        epoch = self._epoch
        run = self._runs.get(key)
        start = run.seq if run is not None else 0
        buffer = self._loading.setdefault(key, [])
        self._loaders[key] = self._loaders.get(key, 0) + 1
        try:
            self.reads += 1
            raws = await self._read_through(run_id, start, need)
        finally:
            self._loaders[key] -= 1
            if not self._loaders[key]:
                del self._loaders[key]
                del self._loading[key]
        read = [self._entry(raw.seq, raw.subject, raw.data) for raw in raws]
        if run is not None and self._runs.get(key) is not run:  # forgotten while reading
            if start > after:  # read it whole, from the start
                return await self._read(run_id, key, after, need=need)
            return [e for e in read if e[0] > after]
        if run is None:
            if epoch != self._epoch:
                return [e for e in read if e[0] > after]  # complete, but cannot be kept
            run = self._runs.get(key) or _RunLog()  # another read may have brought it in
            self._runs[key] = run
        for entry in read:
            run.add(entry)
        for entry in buffer:
            run.add(entry)
        self._runs.move_to_end(key)
        self._held(key, run)
        return run.after(after)

    def _held(self, key: str, run: _RunLog) -> None:
        """Note that ``run`` (held) may have ended, then keep within the bounds: the oldest
        ended runs go first, and live runs (least recently used first) only above
        :attr:`capacity`."""
        if run.ended and key not in self._ended:
            self._ended[key] = None
        while len(self._ended) > ENDED_CAPACITY:
            self._runs.pop(self._ended.popitem(last=False)[0], None)
        while len(self._runs) > self.capacity:
            gone = next(iter(self._ended), None)
            if gone is not None:
                del self._ended[gone]
                self._runs.pop(gone, None)
            else:
                self._ended.pop(self._runs.popitem(last=False)[0], None)

    async def _read_through(self, run_id: str, start: int, need: int) -> list[RawMessage]:
        """The run's stored messages after ``start``, reaching ``need``.

        nats-server answers a direct get from any replica of a replicated stream (R3 on a
        cluster), and a follower may not hold the newest messages yet: a read that stops short of
        an event known to be stored before the read began is stale, not the end of the run (what the
        feed buffers meanwhile does not fill the gap: events stored before the read began are in
        neither). Read on with a short backoff;
        if the replicas stay behind, a :class:`TransientError` has the delivery retried rather than
        a decision taken on a run that lacks the event it decides on."""
        scope = self.log.subjects.run(run_id)
        raws = await self.reader.after(scope, start)
        for delay in _BEHIND_BACKOFF_S:
            last = raws[-1].seq if raws else start
            if last >= need:
                return raws
            self.stale_reads += 1
            await asyncio.sleep(delay)
            raws += await self.reader.after(scope, last)
        if (raws[-1].seq if raws else start) >= need:
            return raws
        raise TransientError(
            f"the log's replicas have not caught up with run {run_id} at sequence {need} "
            f"(direct reads stop at {raws[-1].seq if raws else start}); the event will be retried"
        )

    async def close(self) -> None:
        for task in list(self._prefetching.values()):
            task.cancel()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()  # type: ignore[attr-defined]
        self.live = False


def _handled_seq(log_: EventLog, key: str) -> int | None:
    """The stream sequence of the event being handled, if it is an event of run ``key``."""
    delivery = handling.get()
    if delivery is None:
        return None
    tokens = delivery.subject.split(".")
    if len(tokens) != 6 or tokens[0] != log_.cfg.root or tokens[2] != "run" or tokens[3] != key:
        return None
    return delivery.seq


_feeds: dict[tuple[int, str, str, str], RunFeed] = {}


def shared_feed(log_: EventLog) -> RunFeed:
    """The process's feed for ``log_``'s stream (one per event loop and server): the first
    loader to ask creates it on its own log's connection."""
    loop = asyncio.get_running_loop()
    for k, old in list(_feeds.items()):
        if old.log.nc.is_closed or old.loop.is_closed():
            _feeds.pop(k, None)
    key = (id(loop), str(log_.nc.connected_url or ""), log_.cfg.log_stream, log_.cfg.root)
    feed = _feeds.get(key)
    if feed is None or feed.loop is not loop:
        feed = _feeds[key] = RunFeed(log_)
    return feed


class RunLoader:
    """One handler's view of runs: folds what the process's feed holds (or ``feed``, when
    given) into a :class:`RunState` per run, with this handler's ``trust``."""

    def __init__(
        self,
        log: EventLog,
        *,
        capacity: int = CAPACITY,
        trust: Trust | None = None,
        feed: RunFeed | None = None,
    ) -> None:
        self.log = log
        self.trust = trust
        self.capacity = capacity
        self._feed = feed
        self._cache: OrderedDict[str, RunState] = OrderedDict()

    @property
    def feed(self) -> RunFeed:
        if self._feed is None or self._feed.log.nc.is_closed:
            self._feed = shared_feed(self.log)
        return self._feed

    def scope(self, run_id: str) -> str:
        return self.log.subjects.run(run_id)

    async def state(self, run_id: str) -> RunState:
        """The run folded up to the event being handled (when it is this run's, see the module
        docstring), or up to the newest event in the log; never less."""
        state = self._cache.pop(run_id, None) or RunState(run_id, trust=self.trust)
        for seq, event, reason in await self.feed.entries(run_id, state.seq):
            if seq <= state.seq:
                continue
            if event is None:
                state.seq = seq  # recorded as a dead letter by the handlers; not state
            elif reason is not None:
                state.reject(event, seq, reason)
            else:
                state.apply(event, seq)
        self._cache[run_id] = state
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return state

    def cached(self) -> list[RunState]:
        return list(self._cache.values())

    def forget(self, run_id: str) -> None:
        self._cache.pop(run_id, None)


def rejection_report(rejected: Rejected, stream: str) -> SecurityRejected:
    """The ``security.rejected`` for an unbelieved event; its id depends only on where the event
    is stored, so every handler instance and every later look reports it under one id."""
    claimed = rejected.event
    millis = min(max(int(claimed.time.timestamp() * 1000), 0), _MAX_ULID_MILLIS)
    return SecurityRejected(
        id=derive_event_id("security.rejected", f"{stream}:{rejected.seq}", 0, millis=millis),
        rejected_id=claimed.id,
        rejected_type=claimed.type,
        reason=rejected.reason,
        call_id=rejected.call_id,
    )


async def report_rejected(log: EventLog, handler: str, cause: Event, state: RunState) -> None:
    """Append a ``security.rejected`` for each event of ``state.rejected`` not reported yet,
    stamped by ``handler`` from ``cause`` (ids from :func:`rejection_report`: a second look, or
    another handler, appends a duplicate the log drops)."""
    reports = []
    for rejected in state.rejected:
        report = rejection_report(rejected, log.cfg.log_stream)
        if report.id not in state.reported:
            stamped = stamp(handler, cause, [report])[0]
            reports.append(msgspec.structs.replace(stamped, id=report.id))
    if reports:
        await log.append_batch(reports)
