"""Per-run state kept in memory and brought up to date from the log before every decision.

Handlers see the events of a run interleaved with everything else, possibly split between
instances. Before deciding, a handler asks for the run's state; the loader fetches whatever it
has not folded yet with one batched direct get (``after(seq)``), so the state is always the whole
log of the run as of now — never a guess from the events this instance happened to see.

Stored bytes become events through ``EventLog.decode``: an event stored on another subject than
its own (``bus/placement.py``: a forged type on an identity's own subject) is never folded; it is
kept in ``RunState.rejected``, and :func:`report_rejected` records each such event once as
``security.rejected`` (the policy and the executor call it; handlers that consume its subject
dead-letter it too).
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from nanocrab.bus import EventLog, stamp
from nanocrab.bus.direct import DirectReader
from nanocrab.bus.placement import Misplaced
from nanocrab.events import Event, EventDecodeError, SecurityRejected, derive_event_id
from nanocrab.handlers.runstate import Rejected, RunState, Trust

_MAX_ULID_MILLIS = (1 << 48) - 1


CAPACITY = 256
"""Run states a loader keeps (least recently used first out). A cache, not memory: an evicted
run is folded again from the log when next needed, so the bound costs reads, never correctness;
it keeps a long-lived process's memory flat (bench/soak.py)."""


class RunLoader:
    def __init__(
        self, log: EventLog, *, capacity: int = CAPACITY, trust: Trust | None = None
    ) -> None:
        self.log = log
        self.trust = trust
        self.reader = DirectReader(log.nc, log.cfg.log_stream)
        self.capacity = capacity
        self._cache: OrderedDict[str, RunState] = OrderedDict()

    def scope(self, run_id: str) -> str:
        return self.log.subjects.run(run_id)

    async def state(self, run_id: str) -> RunState:
        """The run folded up to the newest event in the log."""
        state = self._cache.pop(run_id, None) or RunState(run_id, trust=self.trust)
        for raw in await self.reader.after(self.scope(run_id), state.seq):
            try:
                event = self.log.decode(raw.data, subject=raw.subject)
            except Misplaced as exc:
                state.reject(exc.event, raw.seq, exc.message)
                continue
            except EventDecodeError:
                state.seq = raw.seq  # recorded as a dead letter by the handlers; not state
                continue
            state.apply(event, raw.seq)
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
