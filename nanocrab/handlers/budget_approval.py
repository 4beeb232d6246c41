"""Asking a person whether a run over budget may spend more: the policy handler's part.

A ``budget.exceeded{on_exceed: ask}`` (the orchestrator stopped the run before a model call,
``handlers/orchestrator/decide.py``) becomes an ``approval.requested{about: budget}`` — the same
request, answers, signatures, expiry and front ends (``nanocrab approvals`` / ``approve`` /
``deny``, the prompt of ``nanocrab run``, the gateway) as a Guarded tool call. Its ``call_id`` is
the ``budget.exceeded`` id, its ``tool`` is ``budget`` and its ``arguments`` say which cap, what
was spent and the increment; the binding hash covers them, so an answer approves that increment
for that stop only.

The first trusted answer decides: granted → ``budget.raised`` (signed by the policy key; the
orchestrator checks again with the cap raised), denied → ``budget.refused{answer: denied}``; no
answer in time → ``approval.expired`` + ``budget.refused{answer: expired}``; no approver
configured → ``budget.refused{answer: no_approver}`` at once. The orchestrator ends the run on a
refusal. These are pure functions; the policy handler verifies answers and appends.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from datetime import datetime

from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    Budget,
    BudgetExceeded,
    BudgetRaised,
    BudgetRefused,
    Event,
    derive_event_id,
)
from nanocrab.handlers.runstate import RunState
from nanocrab.security import binding_hash, verify

TOOL = "budget"
"""The ``tool`` of a budget approval (what the front ends show)."""


def asked(request: ApprovalRequested) -> bool:
    """Whether ``request`` is a budget approval (not a tool call's)."""
    return request.about == "budget"


def describe(over: BudgetExceeded) -> str:
    """What the person is asked, in words."""
    if over.limit == "usd":
        spent = f"${over.spent_usd:.4f} of ${over.max_usd}"
    else:
        spent = f"{over.spent_tokens} of {over.max_tokens} tokens"
    inc = over.increment or Budget()
    more = " and ".join(
        x for x in (
            f"${inc.max_usd}" if inc.max_usd is not None else "",
            f"{inc.max_tokens} tokens" if inc.max_tokens is not None else "",
        ) if x
    )  # fmt: skip
    return f"the {over.scope} budget ({over.key}) is spent: {spent}; approve {more} more?"


def budget_request(
    over: BudgetExceeded, *, expires_at: datetime, may_ask: bool
) -> ApprovalRequested | BudgetRefused:
    """The approval to ask for ``over`` (``may_ask``: an approver is configured), else the
    refusal that ends the run."""
    approval_id = derive_event_id("approval", over.id, 0)
    if not may_ask:
        return BudgetRefused(
            exceeded_id=over.id,
            answer="no_approver",
            reason="no approver is configured (policy.yaml: approval.approvers or "
            "approval.trust_local_approver)",
        )
    inc = over.increment or Budget()
    arguments: dict[str, object] = {
        "scope": over.scope, "key": over.key, "limit": over.limit,
        "spent_usd": over.spent_usd, "spent_tokens": over.spent_tokens,
        "max_usd": over.max_usd, "max_tokens": over.max_tokens,
        "raise_usd": inc.max_usd, "raise_tokens": inc.max_tokens,
    }  # fmt: skip
    nonce = secrets.token_hex(16)
    return ApprovalRequested(
        approval_id=approval_id,
        call_id=over.id,
        tool=TOOL,
        arguments=arguments,
        tier="guarded",
        reason=describe(over),
        rule=f"budgets.{over.scope}",
        binding_hash=binding_hash(TOOL, arguments, [], nonce),
        nonce=nonce,
        expires_at=expires_at,
        options=["once"],
        about="budget",
    )


def exceeded_of(state: RunState, request: ApprovalRequested) -> BudgetExceeded | None:
    """The stop ``request`` asks about."""
    for e in state.events:
        if isinstance(e, BudgetExceeded) and e.id == request.call_id:
            return e
    return None


def settled(state: RunState, request: ApprovalRequested, policy_keys: Collection[str]) -> bool:
    """Whether the stop ``request`` asks about has its answer already: a ``budget.refused``, or
    a ``budget.raised`` signed by one of ``policy_keys`` (a forged raise settles nothing)."""
    return any(
        e.exceeded_id == request.call_id
        and (isinstance(e, BudgetRefused) or verify(e, policy_keys) is None)
        for e in state.events
        if isinstance(e, BudgetRaised | BudgetRefused)
    )


def answered(
    state: RunState, request: ApprovalRequested, answer: ApprovalGranted | ApprovalDenied
) -> list[Event]:
    """The outcome of the first trusted, in-time ``answer`` to a request not settled yet
    (both checked by the caller): an unsigned ``budget.raised`` (the caller signs it) or a
    ``budget.refused``."""
    over = exceeded_of(state, request)
    if over is None:
        return []
    if isinstance(answer, ApprovalDenied):
        why = f": {answer.reason}" if answer.reason else ""
        return [
            BudgetRefused(
                exceeded_id=over.id,
                approval_id=request.approval_id,
                answer="denied",
                reason=f"denied by {answer.approver}{why}",
            )
        ]
    return [
        BudgetRaised(
            exceeded_id=over.id,
            approval_id=request.approval_id,
            scope=over.scope,
            key=over.key,
            increment=over.increment or Budget(),
            approver=answer.approver,
        )
    ]


def expired(request: ApprovalRequested, reason: str) -> list[Event]:
    """No answer in time (or one after the deadline): the approval expires, the run ends."""
    return [
        ApprovalExpired(approval_id=request.approval_id),
        BudgetRefused(
            exceeded_id=request.call_id,
            approval_id=request.approval_id,
            answer="expired",
            reason=reason,
        ),
    ]
