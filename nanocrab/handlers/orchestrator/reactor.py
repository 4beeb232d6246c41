"""The orchestrator on the bus: folds the run, decides, appends guarded by the run's sequence.

Consumes every durable event of every run (so it wakes up for whatever moves a run forward) and
emits the decisions of :func:`decide`. Each decision is appended with an expected last sequence
on the whole run (``Nats-Expected-Last-Subject-Sequence-Subject``): if anything was appended to
the run since the state was loaded, the decision is dropped and the newer event decides instead.
So redeliveries, restarts and several orchestrator instances never make two decisions for one
state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from nanocrab.bus import Delivery, EventLog, Expect, Reaction
from nanocrab.bus.errors import BusError
from nanocrab.bus.runtime import append_reaction
from nanocrab.events import (
    EVENT_TYPES,
    Event,
    LlmRequested,
    ReplySent,
    RunCompleted,
    RunFailed,
    RunStarted,
    SubagentSpawned,
    ToolRequested,
    ToolSkipped,
    utcnow,
)
from nanocrab.handlers.orchestrator.decide import deadline, decide
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.runstate import RunState, Trust

log = logging.getLogger(__name__)

QUIET_OWN_EVENTS: tuple[type[Event], ...] = (
    RunStarted, LlmRequested, ToolRequested, ToolSkipped, ReplySent, RunCompleted, RunFailed,
    SubagentSpawned,
)  # fmt: skip
"""What :func:`decide` emits that never needs a decision of its own: each leaves the run waiting
for the model, the policy, a tool or a child. Not in the list, because another run's decision
depends on them: a child's ``task.submitted``, a cascaded ``run.cancelled``, and the
``tool.completed`` / ``subagent.completed`` a finished child sends its parent."""

RUN_EVENTS: tuple[type[Event], ...] = tuple(
    cls for cls in EVENT_TYPES.values() if cls.subject_kind == "run" and not cls.ephemeral
)


class Orchestrator:
    name = "orchestrator"
    consumes = RUN_EVENTS

    def __init__(
        self,
        log_: EventLog,
        *,
        name: str = "orchestrator",
        watchdog_interval_s: float = 1.0,
        trust: Trust | None = None,
    ) -> None:
        """``trust`` says which signed grants to believe (a ``spawn`` runs on its grant);
        ``None`` believes every grant — for tests of the loop alone."""
        self.name = name
        self.log = log_
        self.loader = RunLoader(log_, trust=trust)
        self.watchdog_interval_s = watchdog_interval_s

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event] | Reaction:
        if event.run_id is None:
            return []
        if event.source == self.name and isinstance(event, QUIET_OWN_EVENTS):
            return []  # its own decision: the state it leads to waits on someone else
        _, reaction = await self._decide(event.run_id)
        return reaction

    async def _decide(self, run_id: str) -> tuple[RunState, Reaction]:
        """The decision on the run as the log has it now, guarded by the run's last sequence."""
        state = await self.loader.state(run_id)
        decision = decide(state, utcnow())
        if state.terminal and not decision:
            self.loader.forget(run_id)
        return state, Reaction(decision, expect=Expect(state.seq, self.loader.scope(run_id)))

    async def background(self) -> None:
        """Time-outs: nothing else wakes up a run whose tool or model never answers."""
        while True:
            await asyncio.sleep(self.watchdog_interval_s)
            now = utcnow()
            for cached in self.loader.cached():
                limit = deadline(cached)
                if cached.terminal or limit is None or now <= limit or cached.task is None:
                    continue
                with contextlib.suppress(BusError):
                    await self._wake(cached.run_id)

    async def _wake(self, run_id: str) -> None:
        state, reaction = await self._decide(run_id)
        if reaction.events and state.events:
            await append_reaction(self.log, self.name, state.events[-1], reaction)
