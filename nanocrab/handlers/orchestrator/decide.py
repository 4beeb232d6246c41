"""The run state machine as a pure function: ``decide(state, now) -> events``.

Given everything a run's log says, what happens next? The orchestrator's reactor calls this
after every event of the run and appends the answer guarded by the run's last sequence, so a
redelivery or a second orchestrator instance can never decide twice for one state.

Flow: ``task.submitted`` → ``run.started`` + ``llm.requested(0)`` → ``llm.responded`` → its tool
calls one at a time (``tool.requested`` → policy → executor → ``tool.completed``) → next
``llm.requested`` … → an answer without tool calls → ``reply.sent`` + ``run.completed``.
Steering skips the step's remaining calls and delivers the message to the next turn; follow-ups
are delivered after a turn that ends without tool calls.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import ValidationError

from nanocrab.agents import enabled_tools, profile
from nanocrab.events import (
    BudgetExceeded,
    BudgetRefused,
    Event,
    GuardrailChecked,
    LlmRequested,
    MessageQueued,
    PlanStepCompleted,
    ReplySent,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    SpawnDetails,
    SubagentCompleted,
    SubagentSpawned,
    TaskSubmitted,
    TextBlock,
    ToolRequested,
    ToolResolved,
    ToolSkipped,
    child_run_id,
)
from nanocrab.handlers.conversation import text_of
from nanocrab.handlers.orchestrator import plan
from nanocrab.handlers.orchestrator.budget import Spending, over_budget
from nanocrab.handlers.orchestrator.commands import run_command
from nanocrab.handlers.orchestrator.spawn import NATIVE_TOOLS, SpawnArgs
from nanocrab.handlers.runstate import CallState, RunState, TurnState
from nanocrab.policy.budgets import Budgets


def max_steps(state: RunState) -> int:
    assert state.task is not None
    if state.started is not None and state.started.max_steps:
        return state.started.max_steps
    return state.task.max_steps or profile(state.task.agent, state.config).max_steps


def deadline(state: RunState) -> datetime | None:
    if state.started is None or state.task is None:
        return None
    timeout = profile(state.started.agent, state.config).timeout_s
    return state.started.time + timedelta(seconds=timeout)


def decide(
    state: RunState,
    now: datetime,
    *,
    guarded: frozenset[str] = frozenset(),
    routed: bool = False,
    budgets: Budgets | None = None,
    spending: Spending = Spending(),
) -> list[Event]:
    """The next events of the run (see the module docstring).

    ``budgets``: the policy's spending caps; with them (or a task carrying a ``budget``) a
    decision that would call the model is checked first (``budget.py``), and a run over a cap
    ends with ``budget.exceeded`` + ``run.failed{kind: budget}`` instead (or, for a cap set to
    ``on_exceed: ask``, waits for a person's answer: :func:`_within_budget`). ``spending``: what
    the other runs of the run's session, agent and tenant spent (the reactor reads it from the
    usage view when a shared cap is set)."""
    out = _decide(state, now, guarded=guarded, routed=routed)
    uncapped = budgets is None and state.task is not None and state.task.budget is None
    if state.task is None or state.terminal or (uncapped and state.over_budget is None):
        return out  # (a run stopped over budget stays stopped, whatever the caps are now)
    return _within_budget(state, out, budgets or Budgets(), spending)


def _within_budget(
    state: RunState, out: list[Event], budgets: Budgets, spending: Spending
) -> list[Event]:
    """``out``, unless it calls the model past a cap: then the run stops over budget — it ends
    (``on_exceed: fail``), or it waits for a person's answer (``ask``: the policy handler asks)
    and ends when refused, or is checked again with the approved raise when raised. Once a
    failing ``budget.exceeded`` is in the run, every later decision only ends the run."""
    at = next((i for i, e in enumerate(out) if isinstance(e, LlmRequested)), None)
    over = state.over_budget
    if over is not None:
        answer = state.budget_answers.get(over.id)
        if over.on_exceed == "fail" or isinstance(answer, BudgetRefused):
            head = [e for e in out[: len(out) if at is None else at] if isinstance(e, ReplySent)]
            reason = budget_reason(over)
            if isinstance(answer, BudgetRefused):
                reason += f"; more was refused ({answer.answer}: {answer.reason})"
            return [*head, *_finish_failed(state, "budget", reason)]
        if answer is None:
            return out if at is None else out[:at]  # a person is asked: the model call waits
    if at is None:
        return out
    request = out[at]
    assert isinstance(request, LlmRequested)
    started = next((e for e in out if isinstance(e, RunStarted)), None)
    agent = started.agent if started is not None else agent_of(state)
    over = over_budget(state, budgets, spending, agent=agent, turn=request.turn)
    if over is None:
        return out
    if over.on_exceed == "ask":
        return [*out[:at], over]
    return [*out[:at], over, *_finish_failed(state, "budget", budget_reason(over))]


def budget_reason(over: BudgetExceeded) -> str:
    """The ``run.failed`` reason of a run over budget: which cap, what was spent."""
    if over.limit == "usd":
        spent = f"${over.spent_usd:.4f} of ${over.max_usd}"
    else:
        spent = f"{over.spent_tokens} of {over.max_tokens} tokens"
    return f"the {over.scope} budget ({over.key}) is spent: {spent}"


def _decide(
    state: RunState,
    now: datetime,
    *,
    guarded: frozenset[str] = frozenset(),
    routed: bool = False,
) -> list[Event]:
    """``guarded``: the guardrail checkpoints to pin in ``run.started`` when this decision
    starts the run (the chain has a filter for them); later decisions read the pinned ones.
    ``routed``: a router chooses the agent of tasks that name none (:func:`needs_route`), so
    such a run starts once its ``route.decided`` is in."""
    task = state.task
    if task is None:
        return []
    if state.terminal:
        if state.status != "cancelled" or not state.events or state.events[-1] is not state.outcome:
            return []  # decided once, when the cancellation arrived
        reason = getattr(state.outcome, "reason", "") or "no reason given"
        return [
            *_cascade_cancel(state),
            *_to_parent(state, f"The subagent was cancelled: {reason}", is_error=True),
        ]
    if state.status == "new":
        if task.text.strip().startswith("/"):
            if state.reply is not None:  # the answer is out, its run.completed is not yet
                return [RunCompleted(reply=state.reply.text, steps=0)]
            return run_command(state)
        if routed and state.route is None and needs_route(task):
            return []  # waiting for the router
        prof = profile(agent_of(state, routed=routed), state.config)  # the version it pins
        return [
            RunStarted(
                agent=prof.name,
                parent_run_id=task.parent_run_id,
                max_steps=task.max_steps or prof.max_steps,
                guarded=sorted(guarded),
            ),
            *_opening(state, guarded),
        ]
    if (limit := deadline(state)) is not None and now > limit:
        return _finish_failed(
            state, "timeout", f"the run exceeded its time limit ({limit:%H:%M:%S})"
        )
    turn = state.current
    if turn is None:
        return _opening(state, frozenset(state.started.guarded if state.started else ()))
    if turn.failure is not None:
        if turn.failure.kind == "agent":  # a Python agent's code, not a model
            return _finish_failed(state, "agent", f"the agent failed: {turn.failure.message}")
        reason = f"the model call failed ({turn.failure.kind}): {turn.failure.message}"
        return _finish_failed(state, "llm", reason)
    if turn.refused is not None:
        return _finish_failed(state, "llm", f"the model's response was refused: {turn.refused}")
    if turn.response is None:
        return []  # waiting for the model
    steer = _cleared(state, "steer")
    out: list[Event] = []
    for call in turn.calls:
        if call.finished:
            continue
        if call.requested is None:
            if steer:
                out.append(ToolSkipped(call_id=call.call_id, tool=call.tool, reason="steered"))
                continue
            if state.waiting_for_verdict("tool_call", call.call_id):
                return out  # the guardrails look at the call first
            verdict = state.verdict("tool_call", call.call_id)
            if verdict is not None and verdict.action in ("block", "redact"):
                out.append(guardrail_blocked_call(call, verdict))
                continue
            flag = None  # the guardrails ask a person: the policy will, whatever its rules
            if verdict is not None and verdict.action == "require_approval":
                flag = verdict.reason or "flagged by the guardrails"
            out.append(
                ToolRequested(
                    call_id=call.call_id, tool=call.tool, arguments=call.arguments, guardrail=flag
                )
            )
            return out  # one call at a time: a steer can still skip the rest
        if call.tool == plan.TOOL and call.grant is not None and call.completed is None:
            return out + plan.accept(state, call)
        if call.tool in NATIVE_TOOLS and call.grant is not None and call.child_run_id is None:
            return out + _spawn(state, call)
        return out  # waiting for the tool (or its grant)
    if turn.calls:
        if any(_output_unchecked(state, c) for c in turn.calls):
            return out  # the model reads no tool output the guardrails have not seen
        delivers = [m.id for m in steer]
        failed = plan.step_failure(state, turn)
        if failed is not None:
            if not failed.replan:
                why = f"step {failed.index + 1} failed and no re-plan is left: {failed.reason}"
                return [*out, failed, *_finish_failed(state, "plan", why)]
            return [*out, failed, _request(state, turn.index + 1, delivers, [plan.TOOL])]
        if len(state.turns) >= max_steps(state):
            return out + _finish_failed(
                state, "max_steps", f"stopped after {len(state.turns)} steps"
            )
        opened = plan.opening(state) if plan.planning(state, agent_of(state)) else None
        tools = plan.tools_for(state, agent_of(state), opened)
        return [
            *out,
            *([opened] if opened else []),
            _request(state, turn.index + 1, delivers, tools),
        ]
    follow = _cleared(state, "follow_up") + steer
    if state.waiting_for_verdict("reply", turn.response.id):
        return []  # the guardrails read the answer before anyone else does
    answer = _screened_reply(state, turn.response.id, text_of(turn.response.content))
    # a decision of more than one event lands one event at a time: decided again in between
    # (another orchestrator instance, a redelivery), only what is missing is decided
    replied = state.reply is not None and state.reply_turn == turn.index
    reply: list[Event] = [] if replied else [ReplySent(text=answer)]
    if _unchecked_messages(state):
        return reply  # a queued message waits for its verdict before it is delivered
    if follow and len(state.turns) < max_steps(state):
        return [*reply, _request(state, turn.index + 1, [m.id for m in follow])]
    stepped = _step_answered(state, turn, answer)
    if stepped and not isinstance(stepped[-1], PlanStepCompleted):
        return stepped  # the plan goes on with its next step
    return _finish_completed(state, answer, [*stepped, *reply])


def needs_route(task: TaskSubmitted) -> bool:
    """A top-level task that names no agent (``agent`` left at ``default``), not a command."""
    return (
        task.parent_run_id is None
        and task.agent == "default"
        and not (task.text.strip().startswith("/"))
    )


def agent_of(state: RunState, *, routed: bool = True) -> str:
    """The run's agent: as started, else as routed, else as the task named it.

    A route counts only for a task that asked for one (:func:`needs_route`) on a runtime that
    routes (``routed``): a ``route.decided`` for a task that named its agent, for a subagent, or
    with routing off is not believed — the router's identity could otherwise start any run as
    the broadest agent there is (an adversarial pass turned an ``explorer`` run into a
    ``default`` one and ran ``exec``)."""
    if state.started is not None:
        return state.started.agent
    task = state.task
    if task is None:
        return "default"
    if routed and state.route is not None and needs_route(task):
        return state.route.agent
    return task.agent


def _request(
    state: RunState, turn: int, delivers: list[str], tools: list[str] | None = None
) -> LlmRequested:
    """The model call of ``turn``; ``tools``: what it may call (default: the run's own, a
    planning agent's narrowed to its plan, ``plan.tools_for``)."""
    assert state.task is not None
    return LlmRequested(
        turn=turn,
        delivers=delivers,
        tools=tools if tools is not None else plan.tools_for(state, agent_of(state)),
        step_id=f"{state.run_id}.{turn}",
    )


def _step_answered(state: RunState, turn: TurnState, answer: str) -> list[Event]:
    """A planning run's answer that ends a step which is not the plan's last: the step's end
    and the next step's start with its model call (or, decided again between the two, what
    is missing); the last step's end alone when it ends the plan. Empty otherwise: the answer
    is the run's reply."""
    if not plan.planning(state, agent_of(state)) or state.plan is None:
        return []
    done = plan.step_done(state, turn, answer)
    if done is not None:
        following = plan.next_step(state.plan, done.index + 1)
        if following is None:
            return [done]  # the last step: its answer is the run's reply
        tools = plan.tools_for(state, agent_of(state), following)
        return [done, following, _request(state, turn.index + 1, [], tools)]
    opened = plan.opening(state) if turn.index in state.turn_steps else None
    if opened is None:
        return []
    return [
        opened,
        _request(state, turn.index + 1, [], plan.tools_for(state, agent_of(state), opened)),
    ]


def _finish_completed(state: RunState, answer: str, reply: list[Event]) -> list[Event]:
    steps = len(state.turns)
    return [
        *reply,
        RunCompleted(reply=answer, steps=steps),
        *_to_parent(state, answer, is_error=False),
    ]


def _finish_failed(
    state: RunState,
    kind: Literal["llm", "timeout", "max_steps", "budget", "agent", "plan"],
    reason: str,
) -> list[Event]:
    return [
        RunFailed(kind=kind, reason=reason),
        *_to_parent(state, f"The subagent failed ({kind}): {reason}", is_error=True),
    ]


def _to_parent(state: RunState, result: str, *, is_error: bool) -> list[Event]:
    """A child run's outcome, delivered to its parent as the result of the ``spawn`` call."""
    task = state.task
    if task is None or not task.parent_run_id or not task.parent_call_id:
        return []
    if state.run_id != child_run_id(task.parent_run_id, task.parent_call_id):
        return []  # not the run that call started (a task naming a parent it has not)
    run_id, session_id = task.parent_run_id, task.parent_session_id
    return [
        SubagentCompleted(
            child_run_id=state.run_id,
            result=result,
            is_error=is_error,
            run_id=run_id,
            session_id=session_id,
        ),
        ToolResolved(
            call_id=task.parent_call_id,
            tool="spawn",
            is_error=is_error,
            error_kind="failed" if is_error else None,
            content=[TextBlock(result or "(the subagent gave no answer)")],
            details=SpawnDetails(child_run_id=state.run_id, steps=len(state.turns)),
            run_id=run_id,
            session_id=session_id,
        ),
    ]


def _spawn(state: RunState, call: CallState) -> list[Event]:
    assert state.task is not None
    try:
        args = SpawnArgs.model_validate(call.arguments)
    except ValidationError as exc:
        return [
            ToolResolved(
                call_id=call.call_id,
                tool=call.tool,
                is_error=True,
                error_kind="invalid_arguments",
                content=[TextBlock(f"invalid spawn arguments: {exc}")],
            )
        ]
    child = child_run_id(state.run_id, call.call_id)
    mine = set(enabled_tools(agent_of(state), state.task.tools, state.config))
    offered = enabled_tools(args.agent, args.tools, state.config)
    tools = [t for t in offered if t in mine and t != "spawn"]
    return [
        SubagentSpawned(
            child_run_id=child,
            task=args.task,
            tools=tools,
            skills=args.skills,
            call_id=call.call_id,
        ),
        TaskSubmitted(
            text=args.task,
            agent=args.agent,
            parent_run_id=state.run_id,
            parent_call_id=call.call_id,
            parent_session_id=state.task.session_id,
            tools=tools,
            skills=args.skills,
            workspace=state.task.workspace,
            capabilities=state.task.capabilities,  # a child never holds more than its parent
            budget=state.task.budget,  # nor may it spend more in one run
            run_id=child,
            task_id=state.task.task_id,
            session_id=child,
        ),
    ]


def _cascade_cancel(state: RunState) -> list[Event]:
    """A run cancelled just now cancels its running children."""
    reason = "the parent run was cancelled"
    return [
        RunCancelled(run_id=child, reason=reason, by=state.run_id, session_id=child)
        for child, call_id in state.children.items()
        if (c := state.call(call_id)) is None or not c.finished
    ]


# -- guardrails ------------------------------------------------------------------------------


def _opening(state: RunState, guarded: frozenset[str]) -> list[Event]:
    """The first model call, once the task's verdict lets it through (when ``task_input`` is
    guarded); a blocked task ends the run, telling the user why."""
    assert state.task is not None
    if "task_input" in guarded:
        verdict = state.verdict("task_input", state.task.id)
        if verdict is None and ("task_input", state.task.id) not in state.prescreened:
            return []  # waiting for the guardrails
        if verdict is not None and verdict.action == "block":
            reason = verdict.reason or "blocked by the guardrails"
            refusal: list[Event] = []
            if state.reply is None:
                refusal = [ReplySent(text=f"This request was blocked by a guardrail: {reason}")]
            return [
                *refusal,
                RunFailed(kind="guardrail", reason=reason),
                *_to_parent(state, f"The subagent's task was blocked: {reason}", is_error=True),
            ]
    return [_request(state, 0, [])]


def guardrail_blocked_call(call: CallState, verdict: GuardrailChecked) -> ToolResolved:
    """A tool call the guardrails blocked, as the failed result the model reads."""
    reason = verdict.reason or f"blocked by guardrail {', '.join(verdict.fired)}"
    return ToolResolved(
        call_id=call.call_id,
        tool=call.tool,
        is_error=True,
        error_kind="denied",
        content=[TextBlock(f"blocked by a guardrail, the call was not run: {reason}")],
    )


def _output_unchecked(state: RunState, call: CallState) -> bool:
    """A tool result (not a guardrail's own refusal) the guardrails have not judged yet."""
    if call.completed is None or not state.guarded("tool_output"):
        return False
    blocked = state.verdict("tool_call", call.call_id)
    if blocked is not None and blocked.action in ("block", "redact"):
        return False
    return state.waiting_for_verdict("tool_output", call.call_id)


def _cleared(state: RunState, mode: Literal["steer", "follow_up"]) -> list[MessageQueued]:
    """Queued messages ready for delivery: judged already when ``task_input`` is guarded."""
    return [m for m in state.pending(mode) if not state.waiting_for_verdict("task_input", m.id)]


def _unchecked_messages(state: RunState) -> bool:
    return any(
        state.waiting_for_verdict("task_input", m.id)
        for m in state.queued
        if m.id not in state.delivered
    )


def _screened_reply(state: RunState, response_id: str, answer: str) -> str:
    screened = state.screened("reply", response_id, answer)
    if screened is not None:
        return screened
    verdict = state.verdict("reply", response_id)
    reason = verdict.reason if verdict is not None else ""
    return f"(The answer was withheld by a guardrail: {reason or 'blocked'}.)"
