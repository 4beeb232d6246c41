"""The orchestrator on the bus: folds the run, decides, appends guarded by the run's sequence.

Consumes every durable event of every run (so it wakes up for whatever moves a run forward) and
emits the decisions of :func:`decide`. Each decision is appended with an expected last sequence
on the whole run (``Nats-Expected-Last-Subject-Sequence-Subject``): if anything was appended to
the run since the state was loaded, the decision is dropped and the newer event decides instead.
So redeliveries, restarts and several orchestrator instances never make two decisions for one
state.

It also consumes its own dead letters, to reject a task it could not start on the task's run
(``rejections.py``): a task that does not decode, and one whose id is already another event's
(its decision, whose ids derive from the task's, would be dropped as a duplicate of that event's
reactions, so the run would silently never start).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import datetime

import nats.errors

from nanocrab.bus import Delivery, EventLog, Expect, Reaction
from nanocrab.bus.errors import AppendConflict, BusError, PublishRefused, TransientError
from nanocrab.bus.replay import read
from nanocrab.bus.runtime import append_reaction, stamp
from nanocrab.events import (
    EVENT_TYPES,
    BusDeadLettered,
    BusMalformed,
    Event,
    LlmRequested,
    ReplySent,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    SubagentSpawned,
    TaskSubmitted,
    ToolRequested,
    ToolSkipped,
    utcnow,
)
from nanocrab.handlers.orchestrator.decide import deadline, decide
from nanocrab.handlers.orchestrator.rejections import DeadLetter, TaskRejected, reject, task_run
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
    consumes: tuple[type[Event], ...] = (*RUN_EVENTS, BusMalformed, BusDeadLettered)

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
        self.deadlines: dict[str, datetime] = {}
        """Open runs (started, not ended) → when they time out: one entry per open run."""

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event] | Reaction:
        if isinstance(event, BusMalformed | BusDeadLettered):
            return await self._answer(event)
        if event.run_id is None:
            if isinstance(event, TaskSubmitted):
                raise TaskRejected("a task.submitted needs a runid (a new ULID) to start a run")
            return []
        if event.source == self.name and isinstance(event, QUIET_OWN_EVENTS):
            # its own decision: the state it leads to waits on someone else
            if isinstance(event, RunStarted):
                self._watch(await self.loader.state(event.run_id))
            elif isinstance(event, RunCompleted | RunFailed):
                self.deadlines.pop(event.run_id, None)
                self.loader.forget(event.run_id)
            return []
        state, reaction = await self._decide(event.run_id)
        if isinstance(event, TaskSubmitted) and state.status == "new" and reaction.events:
            await self._start(event, reaction)
            return []
        return reaction

    async def _start(self, task: TaskSubmitted, reaction: Reaction) -> None:
        """Append the decision that starts a run, and make sure it landed on the run.

        Its ids derive from the task's id. When that id already belonged to another event whose
        reactions are inside the duplicate window, the server takes the decision for a copy of
        those and stores nothing: the run would never start. That task is rejected instead.
        """
        first, *rest = stamp(self.name, task, reaction.events)
        try:
            appended = await self.log.append(first, expect=reaction.expect)
            if appended.duplicate:
                stored = await self.log.get(appended.seq)
                if stored.subject != appended.subject:
                    raise TaskRejected(
                        f"its id {task.id} is already the id of another event (the "
                        f"orchestrator's reaction to that one is stream sequence {stored.seq}, "
                        f"on {stored.subject}); every event needs an id of its own: publish "
                        "the task again with a new id"
                    )
            await self.log.append_batch(rest)
        except AppendConflict:
            return  # the run moved on meanwhile: the newer event decides
        except PublishRefused:
            raise  # not this identity's to publish: retrying cannot help
        except (BusError, nats.errors.Error) as exc:
            raise TransientError(f"could not start run {task.run_id}: {exc!r}") from exc

    async def _answer(self, record: DeadLetter) -> Reaction:
        """A task this orchestrator dead-lettered is rejected on its run (``rejections.py``)."""
        target = task_run(self.log.subjects, record) if record.handler == self.name else None
        if target is None:
            return Reaction()
        tenant, run_id = target
        state = await self.loader.state(run_id)
        self.loader.forget(run_id)
        events = reject(state, record, tenant=tenant)
        for e in events:
            log.warning("orchestrator: rejected the task of run %s: %s", run_id, e.reason)
        return Reaction(events, expect=Expect(state.seq, self.loader.scope(run_id)))

    async def _decide(self, run_id: str) -> tuple[RunState, Reaction]:
        """The decision on the run as the log has it now, guarded by the run's last sequence."""
        state = await self.loader.state(run_id)
        self._watch(state)
        decision = decide(state, utcnow())
        if state.terminal and not decision:
            self.loader.forget(run_id)
        return state, Reaction(decision, expect=Expect(state.seq, self.loader.scope(run_id)))

    def _watch(self, state: RunState) -> None:
        """Keep ``deadlines`` to the runs that are open: started, not ended."""
        limit = None if state.terminal else deadline(state)
        if limit is None:
            self.deadlines.pop(state.run_id, None)
        else:
            self.deadlines[state.run_id] = limit

    async def background(self) -> None:
        """Time-outs: nothing else wakes up a run whose tool or model never answers.

        Starts by finding the runs the log shows open (``run.started`` and no terminal event),
        so a run left stuck by an earlier process is timed out too; then, every
        ``watchdog_interval_s``, wakes each open run past its deadline. Re-entered after a
        crash, it scans again."""
        for run_id in await open_runs(self.log):
            with contextlib.suppress(BusError):
                self._watch(await self.loader.state(run_id))
        while True:
            await asyncio.sleep(self.watchdog_interval_s)
            now = utcnow()
            for run_id, limit in list(self.deadlines.items()):
                if now <= limit:
                    continue
                with contextlib.suppress(BusError):
                    await self._wake(run_id)

    async def _wake(self, run_id: str) -> None:
        state, reaction = await self._decide(run_id)
        if reaction.events and state.events:
            await append_reaction(self.log, self.name, state.events[-1], reaction)


async def open_runs(log_: EventLog) -> list[str]:
    """Runs the log shows started and not ended (no ``run.completed``/``failed``/``cancelled``),
    in the order they started: one pass over the ``run.*`` events."""
    started: dict[str, None] = {}
    async for stored in read(log_, log_.subjects.of_type("run.*")):
        event = stored.event
        if event is None or event.run_id is None:
            continue
        if isinstance(event, RunStarted):
            started[event.run_id] = None
        elif isinstance(event, RunCompleted | RunFailed | RunCancelled):
            started.pop(event.run_id, None)
    return list(started)
