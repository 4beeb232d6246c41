"""Plan → Step → Action for agents with ``planner: true``: the ``plan`` tool and the decisions
that run a plan, as pure functions of the run's state (``decide.py`` calls them).

- A planning agent's first model call offers only the ``plan`` tool. The call goes through the
  policy like any other (the bundled rules grant it: it touches nothing); once granted the
  orchestrator records ``plan.created`` and completes the call with the plan read back.
- With no step open, the next step not yet started opens (``plan.step_started``) and the model's
  calls are limited to the tools the step declared (intersected with the agent's).
- The model's answer without tool calls closes the step (``plan.step_completed``); the last
  step's answer is the run's reply.
- A step in which a call was denied (a rule, a person, an expiry) or blocked by the guardrails
  fails (``plan.step_failed``); the model is then offered the ``plan`` tool again to re-plan,
  at most :data:`MAX_REPLANS` times, after which the run fails (``kind: plan``).

Every function reads only the state, so a decision of several events that lands one event at a
time is decided again in between and only what is missing is decided (``decide.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, ValidationError

from nanocrab.agents import enabled_tools, profile
from nanocrab.events import (
    PlanCreated,
    PlanStep,
    PlanStepCompleted,
    PlanStepFailed,
    PlanStepStarted,
    TextBlock,
    ToolCompleted,
    ToolResolved,
    derive_event_id,
)
from nanocrab.handlers.runstate import CallState, RunState, TurnState
from nanocrab.tools.base import ToolArgs, ToolContext, ToolResult

TOOL = "plan"
MAX_REPLANS = 2
MAX_STEPS = 12
_SUMMARY = 2000


class StepArgs(ToolArgs):
    intent: str = Field(min_length=1, description="What this step achieves, in a sentence.")
    tools: list[str] = Field(
        default_factory=list, description="The tools the step will call (only these are offered)."
    )
    resources: list[str] = Field(
        default_factory=list,
        description="What the calls touch: paths relative to the workspace, hosts, or connector "
        "resources, glob patterns allowed (an approval of the step covers exactly these).",
    )


class PlanArgs(ToolArgs):
    steps: list[StepArgs] = Field(
        min_length=1, max_length=MAX_STEPS, description="The steps, in the order to run them."
    )


class PlanTool:
    """The ``plan`` tool's schema and catalogue line; the orchestrator runs it, never the
    executor."""

    name: ClassVar[str] = TOOL
    group: ClassVar[str] = "agents"
    description: ClassVar[str] = (
        "Plan the task before acting: list the steps in order, each with its intent, the tools "
        "it will call and the resources (files, hosts, mailboxes, calendars) it will touch. You "
        "then work one step at a time with that step's tools only; end each step with a short "
        "answer (no tool call). A step that declared what it touches can be approved at once."
    )
    args_model: ClassVar[type[ToolArgs]] = PlanArgs
    idempotent: ClassVar[bool] = True

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        return ToolResult.error("internal", "plan is run by the orchestrator, not the executor")


def planning(state: RunState, agent: str) -> bool:
    """Whether the run follows a plan: its agent plans and it is not a subagent's run."""
    planner = profile(agent, state.config).planner
    return planner and state.task is not None and not state.task.parent_run_id


def tools_for(state: RunState, agent: str, opening: PlanStepStarted | None = None) -> list[str]:
    """The tools of the run's next model call: ``plan`` while a plan is wanted, the open step's
    (``opening``: the step this decision opens) within the agent's, else the agent's own."""
    assert state.task is not None
    allowed = enabled_tools(agent, state.task.tools, state.config)
    if not planning(state, agent):
        return allowed
    step = opening or state.step
    if step is not None:
        return [t for t in step.step.tools if t in allowed and t != TOOL]
    if wants_plan(state):
        return [TOOL]
    return allowed


def wants_plan(state: RunState) -> bool:
    """No plan yet, or the last step failed asking for a new one (and none came since)."""
    if state.plan is None:
        return True
    failed = state.step_failed
    return failed is not None and failed.replan and failed.plan_id == state.plan.plan_id


def accept(state: RunState, call: CallState) -> list[ToolResolved | PlanCreated]:
    """A granted ``plan`` call: ``plan.created`` and the call's result (the plan read back), or
    the error the model reads when the plan is malformed."""
    try:
        args = PlanArgs.model_validate(call.arguments)
    except ValidationError as exc:
        return [_result(call, f"invalid plan: {exc}", error=True)]
    steps = [PlanStep(intent=s.intent, tools=s.tools, resources=s.resources) for s in args.steps]
    revision = state.plans
    created = PlanCreated(
        plan_id=derive_event_id("plan", f"{state.run_id}/{call.call_id}", 0),
        call_id=call.call_id,
        steps=steps,
        revision=revision,
    )
    lines = "\n".join(
        f"{i + 1}. {s.intent} (tools: {', '.join(s.tools) or 'none'}"
        f"{'; resources: ' + ', '.join(s.resources) if s.resources else ''})"
        for i, s in enumerate(steps)
    )
    out: list[ToolResolved | PlanCreated] = []
    if state.plan is None or state.plan.call_id != call.call_id:
        out.append(created)
    out.append(_result(call, f"Plan accepted (revision {revision}):\n{lines}"))
    return out


def opening(state: RunState) -> PlanStepStarted | None:
    """The step to open now: none is open, the plan is not waiting for a re-plan, and the
    step after the last ended one (which completed) exists."""
    plan = state.plan
    if plan is None or state.step is not None or wants_plan(state):
        return None
    done = [i for (pid, i) in state.steps_ended if pid == plan.plan_id]
    return next_step(plan, max(done) + 1 if done else 0)


def next_step(plan: PlanCreated, index: int) -> PlanStepStarted | None:
    """Step ``index`` of ``plan`` to open, if the plan has one."""
    if index >= len(plan.steps):
        return None
    return PlanStepStarted(plan_id=plan.plan_id, index=index, step=plan.steps[index])


def step_failure(state: RunState, turn: TurnState) -> PlanStepFailed | None:
    """The open step fails when a call of ``turn`` (all finished) was denied or blocked."""
    step = state.step
    if step is None or state.turn_steps.get(turn.index) is not step:
        return None
    bad = next((c for c in turn.calls if _refused(c)), None)
    if bad is None:
        return None
    why = (
        bad.denied.reason
        if bad.denied is not None
        else _text(bad.completed) or f"{bad.tool} was refused"
    )
    return PlanStepFailed(
        plan_id=step.plan_id,
        index=step.index,
        reason=f"{bad.tool}: {why}",
        replan=state.plans <= MAX_REPLANS,
    )


def step_done(state: RunState, turn: TurnState, answer: str) -> PlanStepCompleted | None:
    """The open step ends with ``turn``'s answer (a turn without tool calls)."""
    step = state.step
    if step is None or state.turn_steps.get(turn.index) is not step:
        return None
    return PlanStepCompleted(plan_id=step.plan_id, index=step.index, summary=answer[:_SUMMARY])


def _refused(call: CallState) -> bool:
    if call.denied is not None:
        return True
    done = call.completed
    return done is not None and done.is_error and done.error_kind == "denied"


def _text(done: ToolCompleted | None) -> str:
    if done is None:
        return ""
    return " ".join(b.text for b in done.content if isinstance(b, TextBlock))[:300]


def _result(call: CallState, text: str, *, error: bool = False) -> ToolResolved:
    return ToolResolved(
        call_id=call.call_id,
        tool=TOOL,
        is_error=error,
        error_kind="invalid_arguments" if error else None,
        content=[TextBlock(text)],
    )
