"""Approving a plan step as a whole: the policy handler's part (``events/plans.py``).

A Guarded call made during an open plan step, whose tool the step declared and whose resources
all match the step's declared resources, is not asked about on its own: the policy asks once for
the step — ``approval.requested{about: plan_step}``, its ``tool`` ``plan_step``, its
``arguments`` the step (plan id, index, intent, tools, resources), its binding hash over them —
and every such call of the step waits for that answer. The first trusted answer decides for all
of them: granted → each gets its own grant (bound to its own arguments as always) citing the
step's approval; denied or expired → each is denied. A call outside what the step declared (an
undeclared resource, another tool), an Unsafe call, or a call the guardrails flagged is asked
about on its own, as without a plan. These are pure functions; the policy handler verifies
answers and appends.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Collection, Sequence
from datetime import datetime
from fnmatch import fnmatchcase
from pathlib import Path

from nanocrab.events import (
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    Capability,
    Event,
    GrantDenied,
    GrantIssued,
    PlanStepStarted,
    derive_event_id,
)
from nanocrab.handlers.runstate import CallState, RunState
from nanocrab.security import binding_hash, verify

TOOL = "plan_step"
"""The ``tool`` of a step approval (what the front ends show)."""


def asked(request: ApprovalRequested) -> bool:
    return request.about == "plan_step"


def step_of(state: RunState, call: CallState) -> PlanStepStarted | None:
    """The open plan step ``call`` was made in (``None``: no step, or the step has ended)."""
    step = state.step
    if step is None:
        return None
    for turn in state.turns:
        if any(c is call for c in turn.calls):
            return step if state.turn_steps.get(turn.index) is step else None
    return None


def covers(
    step: PlanStepStarted, tool: str, capabilities: list[Capability], workspace: Path
) -> bool:
    """Whether the step declared ``tool`` and every resource the call touches (a path is
    matched relative to ``workspace`` as well as whole)."""
    return declared(step.step.tools, step.step.resources, tool, capabilities, workspace)


def declared(
    tools: Sequence[object], resources: Sequence[object], tool: str,
    capabilities: Sequence[Capability], workspace: Path,
) -> bool:  # fmt: skip
    """``tool`` is among ``tools`` and each capability's resource matches a pattern of
    ``resources`` (none declared: nothing is covered)."""
    patterns = [r for r in resources if isinstance(r, str)]
    if tool not in tools or not patterns:
        return False
    for cap in capabilities:
        if cap.resource is None:
            return False  # nothing to match: asked about on its own
        names = [cap.resource]
        with contextlib.suppress(ValueError):  # not under the workspace: matched whole
            names.append(str(Path(cap.resource).relative_to(workspace)))
        if not any(fnmatchcase(n, p) for n in names for p in patterns):
            return False
    return True


def vouches(
    request: ApprovalRequested,
    answers: Sequence[Event],
    grant: GrantIssued,
    trusted: Collection[str],
    workspace: Path,
) -> str | None:
    """Why the executor must not run ``grant`` on the strength of the step approval
    ``request`` (``None``: it may): a trusted approver signed the step as asked, and the step
    declared the grant's tool and resources. Checked again here, not taken on the policy's
    word."""
    signed = any(
        isinstance(a, ApprovalGranted) and a.binding_hash == request.binding_hash
        and verify(a, trusted) is None
        for a in answers
    )  # fmt: skip
    if not signed:
        return f"no trusted approver signed the plan step approval {request.approval_id}"
    tools, resources = request.arguments.get("tools"), request.arguments.get("resources")
    if not isinstance(tools, list) or not isinstance(resources, list) or not declared(
        tools, resources, grant.tool, grant.capabilities, workspace
    ):
        return f"the plan step approved by {request.approval_id} did not declare this call"
    return None


def arguments(step: PlanStepStarted) -> dict[str, object]:
    """What a person approves: the step as declared."""
    s = step.step
    return {
        "plan_id": step.plan_id, "index": step.index, "intent": s.intent,
        "tools": list(s.tools), "resources": list(s.resources),
    }  # fmt: skip


def request_of(state: RunState, step: PlanStepStarted) -> ApprovalRequested | None:
    """The step's approval request, if asked already."""
    return state.approvals.get(approval_id(step))


def approval_id(step: PlanStepStarted) -> str:
    return derive_event_id("approval", f"{step.plan_id}/{step.index}", 0)


def step_request(
    state: RunState, step: PlanStepStarted, *, rule: str | None, expires_at: datetime
) -> ApprovalRequested:
    """Ask once for the whole step (``rule``: the rule that made its first call Guarded)."""
    nonce = secrets.token_hex(16)
    args = arguments(step)
    return ApprovalRequested(
        approval_id=approval_id(step),
        call_id=approval_id(step),
        tool=TOOL,
        arguments=args,
        tier="guarded",
        reason=(
            f"plan step {step.index + 1}: {step.step.intent} — approves its calls of "
            f"{', '.join(step.step.tools)} on {', '.join(step.step.resources)}, nothing else"
        ),
        rule=rule,
        binding_hash=binding_hash(TOOL, args, list(step.step.resources), nonce),
        nonce=nonce,
        expires_at=expires_at,
        options=["once"],
        about="plan_step",
        run_id=state.run_id,
    )


def waiting(state: RunState, request: ApprovalRequested) -> list[CallState]:
    """The calls of the step that asked ``request`` which wait for its answer (requested, not
    decided)."""
    plan_id, index = request.arguments.get("plan_id"), request.arguments.get("index")
    out: list[CallState] = []
    for turn in state.turns:
        step = state.turn_steps.get(turn.index)
        if step is None or (step.plan_id, step.index) != (plan_id, index):
            continue
        out += [
            c for c in turn.calls
            if c.requested is not None and not (c.grant or c.denied or c.approval or c.completed)
        ]  # fmt: skip
    return out


def expired(state: RunState, request: ApprovalRequested, why: str) -> list[Event]:
    """No answer in time: the approval expires and every waiting call is denied."""
    return [
        ApprovalExpired(approval_id=request.approval_id, call_id=request.call_id),
        *(deny(c, request, why) for c in waiting(state, request)),
    ]


def deny(call: CallState, request: ApprovalRequested, why: str) -> GrantDenied:
    index = request.arguments.get("index")
    step = index + 1 if isinstance(index, int) else "?"
    return GrantDenied(
        call_id=call.call_id,
        tool=call.tool,
        reason=f"plan step {step} was not approved: {why}",
        rule=request.rule,
        tier="guarded",
        approval_id=request.approval_id,
    )
