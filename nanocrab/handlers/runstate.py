"""A run's state, folded from its events. Shared by the orchestrator, policy, executor and LLM
handler, so they all read one truth: the log.

What the fold refuses to believe is kept aside in ``RunState.rejected`` (never folded): events
stored on another subject than their own (``bus/placement.py``, found by the loader) and any
``tool.requested`` that is not the model's call — a second request for a call already requested
(the first stands), or one whose tool or arguments differ from the ``tool_use`` block of that
call in ``llm.responded``. So a call's ``requested`` is always exactly what the model asked for.
The same for a ``tool.resolved`` the orchestrator may not publish for its call
(:func:`~nanocrab.events.tools.orchestrator_may_resolve`): the call waits for its real result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from nanocrab.events import (
    AgentResponded,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    BudgetExceeded,
    BudgetRaised,
    BudgetRefused,
    ContextCompacted,
    Event,
    GrantDenied,
    GrantIssued,
    GrantRevoked,
    GuardrailChecked,
    LlmFailed,
    LlmRequested,
    LlmResponded,
    MemoryRecalled,
    MessageQueued,
    PlanCreated,
    PlanStepCompleted,
    PlanStepFailed,
    PlanStepStarted,
    ReplySent,
    RouteDecided,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    SecurityRejected,
    SpawnDetails,
    SubagentCompleted,
    SubagentSpawned,
    TaskSubmitted,
    ToolCompleted,
    ToolRequested,
    ToolResolved,
    ToolSkipped,
    ToolStarted,
    ToolUseBlock,
    redaction_holds,
)
from nanocrab.events.tools import orchestrator_may_resolve

Status = Literal["new", "running", "completed", "failed", "cancelled"]
Answer = ApprovalGranted | ApprovalDenied | ApprovalExpired
Trust = Callable[[Event], bool]
TERMINAL: frozenset[Status] = frozenset({"completed", "failed", "cancelled"})


@dataclass
class CallState:
    """One tool call the model asked for, from request to result."""

    call_id: str
    tool: str
    arguments: dict[str, object]
    requested: ToolRequested | None = None
    grant: GrantIssued | None = None
    denied: GrantDenied | None = None
    approval: ApprovalRequested | None = None
    started: ToolStarted | None = None
    completed: ToolCompleted | None = None
    skipped: ToolSkipped | None = None
    child_run_id: str | None = None

    @property
    def finished(self) -> bool:
        return bool(self.completed or self.skipped or self.denied)


@dataclass(frozen=True)
class Rejected:
    """A stored event of the run the fold did not believe: where it is, what it claims, why."""

    seq: int
    event: Event
    reason: str

    @property
    def call_id(self) -> str | None:
        """The call the event claims to be about, if its type names one."""
        match self.event:
            case (
                ToolRequested() | ToolStarted() | ToolCompleted() | ToolSkipped() | GrantIssued()
                | GrantDenied() | ApprovalRequested()
            ):  # fmt: skip
                return self.event.call_id
        return None


@dataclass
class TurnState:
    """One model call (``llm.requested`` → ``llm.responded``) and the tool calls it asked for."""

    index: int
    request: LlmRequested
    response: LlmResponded | None = None
    failure: LlmFailed | None = None
    calls: list[CallState] = field(default_factory=list)
    refused: str | None = None
    """Why the turn's response was not believed (it reuses a tool call id): the run ends."""

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        if self.response is None:
            return []
        return [b for b in self.response.content if isinstance(b, ToolUseBlock)]


@dataclass
class RunState:
    run_id: str
    task: TaskSubmitted | None = None
    started: RunStarted | None = None
    status: Status = "new"
    turns: list[TurnState] = field(default_factory=list)
    compaction: ContextCompacted | None = None
    queued: list[MessageQueued] = field(default_factory=list)  # not yet delivered, in order
    delivered: set[str] = field(default_factory=set)  # ids of message.queued delivered
    reply: ReplySent | None = None
    reply_turn: int | None = None  # the turn that was current when ``reply`` was sent
    outcome: RunCompleted | RunFailed | RunCancelled | None = None
    revoked: set[str] = field(default_factory=set)
    approvals: dict[str, ApprovalRequested] = field(default_factory=dict)
    # every answer in log order, trusted or not: whoever acts on one verifies it first
    answers: dict[str, list[Answer]] = field(default_factory=dict)
    # signed events a fold should believe (None: all); untrusted grants are not folded in
    trust: Trust | None = field(default=None, repr=False)
    children: dict[str, str] = field(default_factory=dict)  # child run id -> parent call id
    # stored events of the run not believed (see the module docstring), in log order
    rejected: list[Rejected] = field(default_factory=list)
    reported: set[str] = field(default_factory=set)  # ids of the run's security.rejected events
    # guardrail verdicts by (checkpoint, subject id): the first one stands
    verdicts: dict[tuple[str, str], GuardrailChecked] = field(default_factory=dict)
    placeholders: dict[str, str] = field(default_factory=dict)  # the run's redaction table
    # (checkpoint, subject id) this process pre-screened clean under the run's chain
    # (handlers/guardrails.py Prescreener): not folded from the log, a local fact; a state
    # folded again without it waits for the verdict as before
    prescreened: set[tuple[str, str]] = field(default_factory=set)
    route: RouteDecided | None = None  # the router's choice (the first stands)
    recalled: MemoryRecalled | None = None  # memories for the prompt (the first stands)
    over_budget: BudgetExceeded | None = None  # the run's latest stop at a spending cap
    # a person's answer to a stop that asked (by budget.exceeded id; the first stands), and the
    # raises approved so far (only those ``trust`` believes: they are signed by the policy)
    budget_answers: dict[str, BudgetRaised | BudgetRefused] = field(default_factory=dict)
    budget_raises: list[BudgetRaised] = field(default_factory=list)
    # a planning agent's plan (events/plans.py): the current one, how many were made, the open
    # step, how each step ended by (plan id, index), the latest failure, each model turn's step
    plan: PlanCreated | None = None
    plans: int = 0
    step: PlanStepStarted | None = None
    steps_ended: dict[tuple[str, int], PlanStepCompleted | PlanStepFailed] = field(
        default_factory=dict
    )
    step_failed: PlanStepFailed | None = None
    turn_steps: dict[int, PlanStepStarted] = field(default_factory=dict)
    last_time: datetime | None = None
    events: list[Event] = field(default_factory=list)
    seq: int = 0  # stream sequence of the last folded event
    task_seq: int = 0  # stream sequence of the task.submitted
    # the configuration version the orchestrator is about to pin in the run's run.started (set
    # before it decides the start, so the start follows that version's agent profile): a local
    # fact, not folded from the log
    pinning: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def config(self) -> str | None:
        """The run's configuration version: pinned in ``run.started.config``, else the one it
        is about to be pinned to (:attr:`pinning`); ``None``/``""``: the start-up one."""
        return self.started.config if self.started is not None else self.pinning

    @property
    def current(self) -> TurnState | None:
        return self.turns[-1] if self.turns else None

    def call(self, call_id: str) -> CallState | None:
        for turn in reversed(self.turns):
            for c in turn.calls:
                if c.call_id == call_id:
                    return c
        return None

    def message(self, message_id: str) -> MessageQueued | None:
        return next((m for m in self.queued if m.id == message_id), None)

    def pending(self, mode: Literal["steer", "follow_up"]) -> list[MessageQueued]:
        return [m for m in self.queued if m.mode == mode and m.id not in self.delivered]

    def guarded(self, checkpoint: str) -> bool:
        """Whether the run waits for a guardrail verdict at ``checkpoint`` (pinned at start)."""
        return self.started is not None and checkpoint in self.started.guarded

    def verdict(self, checkpoint: str, target_id: str) -> GuardrailChecked | None:
        return self.verdicts.get((checkpoint, target_id))

    def waiting_for_verdict(self, checkpoint: str, target_id: str) -> bool:
        """The run waits at ``checkpoint`` and has no verdict on ``target_id`` yet (nor a clean
        pre-screen: then the verdict, an ``allow``, is recorded after the fact)."""
        key = (checkpoint, target_id)
        return self.guarded(checkpoint) and key not in self.verdicts and key not in self.prescreened

    def screened(self, checkpoint: str, target_id: str, text: str) -> str | None:
        """``text`` as the guardrails let it through at ``checkpoint``: redacted when the
        verdict redacted it, ``None`` when the verdict blocked it (or its redaction does not
        hold: :func:`~nanocrab.events.redaction_holds`)."""
        v = self.verdicts.get((checkpoint, target_id))
        if v is None:
            return text
        if v.action == "block" or not redaction_holds(text, v):
            return None  # a "redaction" that adds words of its own is no redaction
        return v.redacted_text if v.redacted_text is not None else text

    def reject(self, event: Event, seq: int, reason: str) -> None:
        """Keep ``event`` (stored at ``seq``) aside, unbelieved; the fold moves past it."""
        self.seq = max(self.seq, seq)
        self.rejected.append(Rejected(seq, event, reason))

    def apply(self, event: Event, seq: int = 0) -> None:
        """Fold one event in (events must come in log order)."""
        if self.task is not None and event.tenant != self.task.tenant:
            # run ids are chosen by whoever submits a task: another tenant's event naming this
            # run (a forged subagent answering this run's spawn call) is not this run's
            self.reject(event, seq, f"an event of tenant {event.tenant!r} in a run of another")
            return
        if isinstance(event, ToolRequested) and not self._believed(event, seq):
            return
        if isinstance(event, ToolResolved) and not self._resolves(event, seq):
            return
        if isinstance(event, LlmResponded) and not (
            self._from_driver(event, seq) and self._distinct_calls(event, seq)
        ):
            return
        self.events.append(event)
        self.seq = max(self.seq, seq)
        self.last_time = event.time
        match event:
            case TaskSubmitted():
                if self.task is None:
                    self.task, self.task_seq = event, seq
            case RunStarted():
                self.started = event
                if self.status == "new":
                    self.status = "running"
            case LlmRequested():
                self.turns.append(TurnState(index=event.turn, request=event))
                self.delivered.update(event.delivers)
                if self.step is not None:
                    self.turn_steps[event.turn] = self.step
            case LlmResponded():
                turn = self._turn(event.turn)
                if turn is not None and turn.response is None:
                    turn.response = event
                    turn.calls = [CallState(b.id, b.name, dict(b.input)) for b in turn.tool_uses]
            case LlmFailed():
                turn = self._turn(event.turn)
                if turn is not None and not event.will_retry:
                    turn.failure = event
            case ContextCompacted():
                self.compaction = event
            case ToolRequested():
                if (c := self.call(event.call_id)) is not None:
                    c.requested = event  # _believed: the model's call, and the first request
            case GrantIssued():
                if self.trust is not None and not self.trust(event):
                    return
                if (c := self.call(event.call_id)) is not None and c.grant is None:
                    c.grant = event
            case GrantDenied():
                # a denial after a grant (an expiry racing an answer) changes nothing: the grant
                # was first, the executor acts on it
                c = self.call(event.call_id)
                if c is not None and c.denied is None and c.grant is None:
                    c.denied = event
            case GrantRevoked():
                self.revoked.add(event.grant_id)
            case ApprovalRequested():
                self.approvals.setdefault(event.approval_id, event)
                if (c := self.call(event.call_id)) is not None and c.approval is None:
                    c.approval = event
            case ApprovalGranted() | ApprovalDenied() | ApprovalExpired():
                self.answers.setdefault(event.approval_id, []).append(event)
            case ToolStarted():
                if (c := self.call(event.call_id)) is not None:
                    c.started = event
            case ToolCompleted():
                if (c := self.call(event.call_id)) is not None and c.completed is None:
                    c.completed = event
            case ToolSkipped():
                if (c := self.call(event.call_id)) is not None:
                    c.skipped = event
            case SubagentSpawned():
                if event.call_id and (c := self.call(event.call_id)) is not None:
                    c.child_run_id = event.child_run_id
                self.children[event.child_run_id] = event.call_id or ""
            case SubagentCompleted():
                pass
            case MessageQueued():
                self.queued.append(event)
            case ReplySent():
                self.reply = event
                self.reply_turn = self.turns[-1].index if self.turns else None
            case RunCompleted():
                self.outcome, self.status = event, "completed"
            case RunFailed():
                self.outcome, self.status = event, "failed"
            case RunCancelled():
                if not self.terminal:
                    self.outcome, self.status = event, "cancelled"
            case SecurityRejected():
                self.reported.add(event.id)
            case RouteDecided():
                if self.route is None:
                    self.route = event
            case MemoryRecalled():
                if self.recalled is None:
                    self.recalled = event
            case BudgetExceeded():
                self.over_budget = event
            case BudgetRaised():
                if self.trust is not None and not self.trust(event):
                    return
                if event.exceeded_id not in self.budget_answers:
                    self.budget_answers[event.exceeded_id] = event
                    self.budget_raises.append(event)
            case BudgetRefused():
                self.budget_answers.setdefault(event.exceeded_id, event)
            case PlanCreated():
                if self.plan is None or self.plan.plan_id != event.plan_id:
                    self.plan, self.plans, self.step = event, self.plans + 1, None
            case PlanStepStarted():
                if self.plan is not None and event.plan_id == self.plan.plan_id:
                    self.step = event
            case PlanStepCompleted() | PlanStepFailed():
                key = (event.plan_id, event.index)
                if key not in self.steps_ended:
                    self.steps_ended[key] = event
                    if isinstance(event, PlanStepFailed):
                        self.step_failed = event
                if self.step is not None and key == (self.step.plan_id, self.step.index):
                    self.step = None
            case GuardrailChecked():
                self.verdicts.setdefault((event.checkpoint, event.target_id), event)
                self.placeholders.update(event.placeholders_added)
            case _:
                pass

    def _resolves(self, event: ToolResolved, seq: int) -> bool:
        """Whether the orchestrator's result stands for its call; one that does not (a call the
        executor runs, a refusal no blocking verdict stands behind) is kept aside in
        ``rejected``, and the call waits for its real result."""
        call = self.call(event.call_id)
        if call is None:  # a result before its call: it would stand for the real one
            self.reject(event, seq, "the orchestrator settled a call the model has not made")
            return False
        if call.completed is not None:
            return True  # folded as any result is: the first one stands
        verdict = self.verdicts.get(("tool_call", call.call_id))
        blocked = verdict is not None and verdict.action in ("block", "redact")
        granted = call.grant.tool if call.grant is not None else None
        requested = call.requested is not None
        child = event.details.child_run_id if isinstance(event.details, SpawnDetails) else None
        if child != call.child_run_id:  # the answer of the run this call started, or none
            self.reject(event, seq, "a subagent's answer from a run this call did not start")
            return False
        if orchestrator_may_resolve(
            event, granted_tool=granted, requested=requested, blocked=blocked
        ):
            return True
        self.reject(event, seq, "the orchestrator settled a call it does not run")
        return False

    def _believed(self, event: ToolRequested, seq: int) -> bool:
        """Whether ``event`` is the request for the model's call. One that is not is kept aside
        in ``rejected``; a word-for-word repeat of the request already folded is just skipped."""
        call = self.call(event.call_id)
        if call is not None and call.requested is not None:
            if call.requested.tool == event.tool and call.requested.arguments == event.arguments:
                self.seq = max(self.seq, seq)
                return False
            why = (
                f"tool.requested {event.id}: a second request for call {event.call_id} with "
                f"other arguments (the first, {call.requested.id}, stands)"
            )
        elif call is None:
            why = f"tool.requested {event.id}: the model asked for no call {event.call_id}"
        elif event.tool != call.tool or event.arguments != call.arguments:
            why = (
                f"tool.requested {event.id} asks for {event.tool!r} with other arguments than "
                f"the model's call {event.call_id} ({call.tool!r})"
            )
        else:
            return True
        self.reject(event, seq, why)
        return False

    def _from_driver(self, event: LlmResponded, seq: int) -> bool:
        """Whether ``event`` answers as the run's driver does: ``agent.responded`` in a run a
        Python agent drives, ``llm.responded`` in any other. (An adversarial pass: the pyagent
        identity answered a model-driven run's turns, and ran its tools.)"""
        python = self.started is not None and self.started.driver == "python"
        if isinstance(event, AgentResponded) == python:
            return True
        who = "a Python agent" if isinstance(event, AgentResponded) else "the model"
        self.reject(event, seq, f"an answer from {who}, not from the run's driver")
        return False

    def _distinct_calls(self, event: LlmResponded, seq: int) -> bool:
        """Whether the tool calls of ``event`` (a turn's response) have ids of their own. A
        call id is what verdicts, approvals, grants and the audit know a call by: one used
        again — in the same response, or after an earlier turn's — would take the first call's
        "allow" and approval for another call (the model, or a compromised ``llm`` identity,
        chooses the ids). Such a response is kept aside and its turn refused: the run ends."""
        turn = self._turn(event.turn)
        if turn is None or turn.response is not None or turn.refused is not None:
            return True  # no such turn, or answered already: the fold ignores it anyway
        seen = {c.call_id for t in self.turns for c in t.calls}
        ids = [b.id for b in event.content if isinstance(b, ToolUseBlock)]
        repeated = sorted({i for i in ids if i in seen or ids.count(i) > 1})
        if not repeated:
            return True
        why = (f"llm.responded {event.id}: tool call id {', '.join(repeated)} used before in "
               "this run; a call id must name one call")  # fmt: skip
        self.reject(event, seq, why)
        turn.refused = why
        return False

    def _turn(self, index: int) -> TurnState | None:
        for t in reversed(self.turns):
            if t.index == index:
                return t
        return None


def fold(run_id: str, events: list[tuple[int, Event]], trust: Trust | None = None) -> RunState:
    state = RunState(run_id, trust=trust)
    for seq, event in events:
        state.apply(event, seq)
    return state


def passed_untouched(event: Event) -> bool:
    """Whether ``event`` is a guardrails verdict that lets its subject through as it is (an
    ``allow`` with no finding, no redaction, no error): what a run that went on after a clean
    pre-screen already assumed, so the orchestrator's decision stands when one lands first
    (:attr:`~nanocrab.bus.Expect.neutral`)."""
    return (
        isinstance(event, GuardrailChecked)
        and event.action == "allow"
        and not event.findings
        and event.redacted_text is None
        and not event.placeholders_added
        and event.error is None
    )
