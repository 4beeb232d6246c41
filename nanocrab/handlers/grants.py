"""The policy handler's small decisions, as pure functions: raising a decision's tier, the tier a
capability's declared permissions call for, and the ``grant.denied`` events it answers with."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from nanocrab.events import ApprovalRequested, GrantDenied
from nanocrab.events.values import RiskTier
from nanocrab.policy import Decision

_TIERS = ("safe", "guarded", "unsafe", "deny")


def raised(decision: Decision, tier: RiskTier, why: str) -> Decision:
    """``decision`` at ``tier`` if that is stricter (a tier is only ever raised), saying why."""
    if _TIERS.index(tier) <= _TIERS.index(decision.tier):
        return decision
    return dataclasses.replace(decision, tier=tier, reason=f"{decision.reason}; {why}")


def tier_for(permissions: Sequence[str]) -> RiskTier:
    """The least tier a capability's declared permissions call for: reading is Safe, writing
    asks a person (Guarded), the network every time (Unsafe)."""
    if "net" in permissions:
        return "unsafe"
    if "fs.write" in permissions:
        return "guarded"
    return "safe"


def deny(
    call_id: str,
    tool: str,
    reason: str,
    *,
    rule: str | None = None,
    tier: RiskTier = "deny",
    approval_id: str | None = None,
) -> GrantDenied:
    return GrantDenied(
        call_id=call_id,
        tool=tool,
        reason=reason,
        rule=rule,
        tier=tier,
        approval_id=approval_id,
    )


def deny_call(request: ApprovalRequested, reason: str) -> GrantDenied:
    return deny(
        request.call_id,
        request.tool,
        reason,
        rule=request.rule,
        tier=request.tier,
        approval_id=request.approval_id,
    )
