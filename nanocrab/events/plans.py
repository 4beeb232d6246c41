"""Plans: a planning agent's run as Plan → Step → Action (seed 000).

A run of an agent with ``planner: true`` (agents.yaml) first asks the model for a plan through the
``plan`` tool. The orchestrator records it (``plan.created``), then runs it one step at a time:
``plan.step_started`` opens a step (the model's next calls may use only the tools the step
declared), the model's answer without tool calls closes it (``plan.step_completed``), a step in
which a call was denied or blocked fails (``plan.step_failed``) and the model is asked for a new
plan, a bounded number of times. A step that declared Guarded tools is approved as a whole: the
policy handler asks once (``approval.requested{about: plan_step}``) and grants the step's calls
that match what it declared — those tools, on those resources — and nothing else.
"""

from __future__ import annotations

import msgspec

from nanocrab.events.base import Event


class PlanStep(msgspec.Struct, frozen=True, kw_only=True):
    """One step as the model declared it: what for, with which tools, on which resources
    (glob patterns the policy matches against a call's resources: paths relative to the
    workspace, hosts, ``mail:inbox``…; empty: no resource is declared, so a Guarded call of the
    step is asked about on its own)."""

    intent: str
    tools: list[str] = []
    resources: list[str] = []


class PlanCreated(Event, frozen=True, tag="plan.created"):
    """The model's plan, accepted: ``revision`` 0 for the first, +1 for each re-plan.
    ``call_id``: the ``plan`` tool call it came from."""

    plan_id: str
    call_id: str
    steps: list[PlanStep]
    revision: int = 0


class PlanStepStarted(Event, frozen=True, tag="plan.step_started"):
    """Step ``index`` (0-based) of plan ``plan_id`` begins; the next model call works on it
    with ``step.tools`` only."""

    plan_id: str
    index: int
    step: PlanStep


class PlanStepCompleted(Event, frozen=True, tag="plan.step_completed"):
    """The model ended step ``index`` with an answer (``summary``: its text, clipped)."""

    plan_id: str
    index: int
    summary: str = ""


class PlanStepFailed(Event, frozen=True, tag="plan.step_failed"):
    """Step ``index`` failed (a call denied, blocked or refused by a person); ``replan``: the
    model is asked for a new plan (else the run fails: re-plans are bounded)."""

    plan_id: str
    index: int
    reason: str
    replan: bool = False
