"""Per-run state kept in memory and brought up to date from the log before every decision.

Handlers see the events of a run interleaved with everything else, possibly split between
instances. Before deciding, a handler asks for the run's state; the loader fetches whatever it
has not folded yet with one batched direct get (``after(seq)``), so the state is always the whole
log of the run as of now — never a guess from the events this instance happened to see.
"""

from __future__ import annotations

from collections import OrderedDict

from nanocrab.bus import EventLog
from nanocrab.bus.direct import DirectReader
from nanocrab.events import EventDecodeError
from nanocrab.handlers.runstate import RunState, Trust


class RunLoader:
    def __init__(self, log: EventLog, *, capacity: int = 4096, trust: Trust | None = None) -> None:
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
                event = self.log.codec.decode(raw.data)
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
