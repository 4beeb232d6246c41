"""The orchestrator on the bus: folds the run, decides, appends guarded by the run's sequence.

Consumes every durable event of every run that may move it forward (so not its own
``QUIET_OWN_EVENTS``) and emits the decisions of :func:`decide`. Each decision is appended with
an expected last sequence on the whole run (``Nats-Expected-Last-Subject-Sequence-Subject``): if
anything was appended to the run since the state was loaded, the decision is dropped and the newer
event decides instead.
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
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

import msgspec
import nats.errors

from nanocrab.agents import profile
from nanocrab.bus import Delivery, EventLog, Expect, Reaction
from nanocrab.bus.errors import AppendConflict, BusError, PublishRefused, TransientError
from nanocrab.bus.reactions import (
    append_chained,
    append_decision_pipelined,
    append_reaction,
    stamp,
)
from nanocrab.bus.replay import read
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
from nanocrab.handlers.orchestrator.budget import UsageView
from nanocrab.handlers.orchestrator.decide import agent_of, deadline, decide
from nanocrab.handlers.orchestrator.rejections import DeadLetter, TaskRejected, reject, task_run
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.runstate import RunState, Trust, passed_untouched
from nanocrab.policy.budgets import Budgets
from nanocrab.pyagent.loader import run_agent
from nanocrab.reload import ConfigView

if TYPE_CHECKING:  # the guardrails library loads only where guardrails are on
    from nanocrab.handlers.guardrails import Prescreener

log = logging.getLogger(__name__)

QUIET_OWN_EVENTS: tuple[type[Event], ...] = (
    RunStarted, LlmRequested, ToolRequested, ToolSkipped, ReplySent, RunCompleted, RunFailed,
    SubagentSpawned,
)  # fmt: skip
"""What :func:`decide` emits that never needs a decision of its own: each leaves the run waiting
for the model, the policy, a tool or a child. Not in the list, because another run's decision
depends on them: a child's ``task.submitted``, a cascaded ``run.cancelled``, and the
``tool.completed`` / ``subagent.completed`` a finished child sends its parent.

The orchestrator's consumer does not even receive these types (a third of a run's deliveries):
the broker lets only the orchestrator publish them (``llm.requested`` also the LLM handler, which
never does), and the bookkeeping they used to trigger (a run's deadline, forgetting an ended run)
is done when the decision is made."""

RUN_EVENTS: tuple[type[Event], ...] = tuple(
    cls for cls in EVENT_TYPES.values() if cls.subject_kind == "run" and not cls.ephemeral
)

# Every other run event is consumed, even one no decision reads (an alert, a Python agent's log
# line or metric): a decision is appended expecting the run's last sequence, and when an event
# lands between the state's read and that append the decision is dropped for "the newer event
# decides instead". That holds only if the newer event is delivered here. (Leaving alerts out
# stalled a run for good: a blocking verdict and its alert are two appends, and a decision on the
# verdict read before the alert landed was dropped with nothing left to decide.)


_HANDS_ON = (LlmRequested, ToolRequested, RunCompleted, RunFailed, RunCancelled)
"""A decision ending with one of these waits for no verdict: what goes on comes from another
handler (the model's answer, a grant) or nowhere (the run ended)."""


def guard_of(decision: Sequence[Event], seq: int, scope: str) -> Expect:
    """The precondition of appending ``decision``, made on the run as of ``seq``.

    A decision that hands the run on (or ends it) stands on top of a clean verdict that landed
    first (:attr:`Expect.neutral`); one that waits for a verdict to go on (a reply sent while a
    queued message is checked) must not be appended past it: the run goes on at that verdict's
    delivery, which would decide on a state without the decision, conflict with it, and leave
    the run waiting for ever."""
    hands_on = bool(decision) and isinstance(decision[-1], _HANDS_ON)
    return Expect(seq, scope, passed_untouched if hands_on else None)


class Orchestrator:
    name = "orchestrator"
    consumes: tuple[type[Event], ...] = (
        *(t for t in RUN_EVENTS if t not in QUIET_OWN_EVENTS),
        BusMalformed,
        BusDeadLettered,
    )
    concurrency = 64
    """Events of different runs are decided side by side (the runtime keeps each run's events
    in order); every decision is guarded by the run's last sequence anyway."""
    admission = frozenset({"task.submitted"})
    """New runs start when :meth:`admit` says so; the events of runs going on come first."""
    busy_runs = 128
    """Runs moving at once (decided on in the last ``busy_window_s``) above which new tasks wait
    in hand: a burst of a thousand tasks then completes run by run, not all at the very end. A
    run waiting for a person, a slow model or a long tool stops counting after the window, so
    nothing waits on it."""
    busy_window_s = 2.0

    def __init__(
        self,
        log_: EventLog,
        *,
        name: str = "orchestrator",
        watchdog_interval_s: float = 1.0,
        trust: Trust | None = None,
        guarded: frozenset[str] = frozenset(),
        routed: bool = False,
        config: ConfigView | None = None,
        prescreen: Prescreener | None = None,
        budgets: Budgets | None = None,
        usage: UsageView | None = None,
    ) -> None:
        """``trust`` says which signed grants to believe (a ``spawn`` runs on its grant);
        ``None`` believes every grant — for tests of the loop alone. ``guarded``: the guardrail
        checkpoints new runs wait for (pinned in their ``run.started``; the guardrails chain
        has a filter for them), empty without guardrails. ``config``: the versioned
        configuration; a run pins the version active at the event that starts it
        (``run.started.config``, docs/reload.md). ``prescreen``: what a guarded checkpoint is
        about to receive is pre-screened here, and a run moves on without waiting for a
        verdict that can only be a clean ``allow`` (``handlers/guardrails.py``). ``budgets``:
        the spending caps checked before each model call; ``usage`` the spending of other runs
        for the caps of sessions, agents and tenants (``budget.py``)."""
        self.budgets = budgets
        self.usage = usage
        self.config = config
        self.prescreen = prescreen
        self.name = name
        self.guarded = guarded
        self.routed = routed  # a router decides the agent of tasks naming none: wait for it
        self.log = log_
        self.loader = RunLoader(log_, trust=trust)
        self.watchdog_interval_s = watchdog_interval_s
        self.deadlines: dict[str, datetime] = {}
        """Open runs (started, not ended) → when they time out: one entry per open run."""
        self._moving: dict[str, float] = {}  # run → when it was last decided on (monotonic)
        self._busy_checked = 0.0
        self._busy = 0

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event] | Reaction:
        if isinstance(event, BusMalformed | BusDeadLettered):
            return await self._answer(event)
        if event.run_id is None:
            if isinstance(event, TaskSubmitted):
                raise TaskRejected("a task.submitted needs a runid (a new ULID) to start a run")
            return []
        if event.source == self.name and isinstance(event, QUIET_OWN_EVENTS):
            # its own decision (a consumer made before they were filtered out): the state it
            # leads to waits on someone else, and its bookkeeping was done when it was decided
            if isinstance(event, RunCompleted | RunFailed):
                self._ended(event.run_id)
            return []
        state, reaction = await self._decide(event.run_id, event, delivery.seq)
        if self.config is not None and state.status == "new":
            reaction = await self._pin(reaction, delivery.seq)
        if not state.terminal:
            self._moving[event.run_id] = time.monotonic()
        self._note(state, reaction.events)  # after: a run this decision ends stops moving
        if isinstance(event, TaskSubmitted) and state.status == "new" and reaction.events:
            await self._start(event, reaction)
            return []
        return reaction

    async def _pin(self, reaction: Reaction, seq: int) -> Reaction:
        """Pin the configuration version active at stream sequence ``seq`` in the run's
        ``run.started`` (every orchestrator instance computes the same one from the log)."""
        assert self.config is not None
        if not any(isinstance(e, RunStarted) for e in reaction.events):
            return reaction
        version = await self.config.version_at(seq)
        started = next(e for e in reaction.events if isinstance(e, RunStarted))
        # who answers the run's turns: the run believes only its driver's answers
        python = await run_agent(self.config, started.agent, version) is not None
        driver: Literal["model", "python"] = "python" if python else "model"
        events = [
            msgspec.structs.replace(e, config=version, driver=driver)
            if isinstance(e, RunStarted)
            else e
            for e in reaction.events
        ]
        return Reaction(events, expect=reaction.expect, chained=reaction.chained)

    async def _start(self, task: TaskSubmitted, reaction: Reaction) -> None:
        """Append the decision that starts a run, and make sure it landed on the run.

        Its ids derive from the task's id. When that id already belonged to another event whose
        reactions are inside the duplicate window, the server takes the decision for a copy of
        those and stores nothing: the run would never start. That task is rejected instead.
        """
        first, *rest = stamp(self.name, task, reaction.events)
        expect = reaction.expect
        try:
            # one round trip for the start and the first model call, when nothing came between
            if expect is not None and await append_decision_pipelined(
                self.log, [first, *rest], expect
            ):
                return
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
            await append_chained(self.log, appended, rest, expect.scope if expect else None,
                                 neutral=expect.neutral if expect else None)  # as Reaction.chained
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

    async def _decide(
        self, run_id: str, event: Event | None = None, seq: int | None = None
    ) -> tuple[RunState, Reaction]:
        """The decision on the run as the log has it now, guarded by the run's last sequence
        (``event``: the one being handled, pre-screened first when guardrails are on; ``seq``:
        its stream sequence, which decides the version a run it starts pins)."""
        pinned: str | None = None
        if seq is not None and self.config is not None and isinstance(event, TaskSubmitted):
            # the version a run it starts would pin: read alongside the run, one wait not two
            state, pinned = await asyncio.gather(
                self.loader.state(run_id), self.config.version_at(seq)
            )
        else:
            state = await self.loader.state(run_id)
        if event is not None and self.prescreen is not None:
            self.prescreen.event(state, event)
        self._watch(state)
        now = utcnow()
        budgets = await self._budgets(state)
        decision = decide(state, now, guarded=self.guarded, routed=self.routed, budgets=budgets)
        if (
            seq is not None
            and self.config is not None
            and state.started is None
            and any(isinstance(e, RunStarted) for e in decision)
        ):  # the start follows the agent profile of the version it pins (``_pin``)
            version = pinned if pinned is not None else await self.config.version_at(seq)
            if version != (state.pinning or ""):
                state.pinning = version
                decision = decide(state, now, guarded=self.guarded, routed=self.routed,
                                  budgets=budgets)  # fmt: skip
        if (
            self.usage is not None
            and budgets is not None
            and budgets.shared
            and state.task is not None
            and any(isinstance(e, LlmRequested) for e in decision)
        ):  # a model call under a shared cap: decided again with the other runs' spending
            spending = await self.usage.spending(
                run_id=run_id,
                session_id=state.task.session_id,
                agent=agent_of(state, routed=self.routed),
                tenant=state.task.tenant,
            )
            decision = decide(state, now, guarded=self.guarded, routed=self.routed,
                              budgets=budgets, spending=spending)  # fmt: skip
        if state.terminal and not decision:
            self.loader.forget(run_id)
        guard = guard_of(decision, state.seq, self.loader.scope(run_id))
        return state, Reaction(decision, expect=guard, chained=True)

    async def _budgets(self, state: RunState) -> Budgets | None:
        """The spending caps of the run's pinned configuration version (hot reload: a run keeps
        the caps it started under), else ``budgets`` as given."""
        budgets = self.budgets
        if self.config is not None and budgets is not None:
            pin = state.started.config if state.started is not None else None
            loaded = await self.config.ensure(pin) if pin else self.config.get(pin)
            budgets = loaded.policy.budgets
        return budgets if budgets is not None and budgets.any else None

    def _note(self, state: RunState, decision: Sequence[Event]) -> None:
        """Bookkeeping for a decision about to be appended: a run it starts gets its deadline, a
        run it ends is forgotten. If the decision is superseded instead, the newer event's
        decision (or the watchdog) sets things right."""
        for e in decision:
            if e.run_id not in (None, state.run_id):
                continue  # a child's task, a parent's result
            if isinstance(e, RunStarted) and state.task is not None:
                self.deadlines[state.run_id] = e.time + timedelta(
                    seconds=profile(e.agent, e.config).timeout_s  # as decide.deadline
                )
            elif isinstance(e, RunCompleted | RunFailed):
                self._ended(state.run_id)

    def _ended(self, run_id: str) -> None:
        self.deadlines.pop(run_id, None)
        self._moving.pop(run_id, None)
        self.loader.forget(run_id)

    def admit(self) -> bool:
        """Whether to start another run now (the runtime asks; see ``admission``)."""
        now = time.monotonic()
        if now - self._busy_checked > 0.01:
            horizon = now - self.busy_window_s
            for run_id in [r for r, t in self._moving.items() if t < horizon]:
                del self._moving[run_id]
            self._busy, self._busy_checked = len(self._moving), now
        if self._busy >= self.busy_runs:
            return False
        self._busy += 1  # the run it starts, until the next count
        return True

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
