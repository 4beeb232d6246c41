"""Grants (minted only by the policy handler), human approvals, and refused forgeries.

Signed events (``grant.issued``, ``approval.granted``, ``approval.denied``) carry the signer's
public nkey and an Ed25519 signature over their canonical bytes (every field except
``signature``, see ``nanocrab.security.signing``). ``binding_hash`` ties a Guarded/Unsafe grant
and its approval to one exact call: sha256 over (tool, arguments, resource, nonce).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec

from nanocrab.events.base import Event
from nanocrab.events.values import Capability, GrantScope, RiskTier

Remember = Literal["once", "session"]


class GrantIssued(Event, frozen=True, tag="grant.issued"):
    grant_id: str
    call_id: str
    tool: str
    capabilities: list[Capability]
    scope: GrantScope
    tier: RiskTier
    expires_at: datetime
    rule: str | None = None  # the policy rule that decided
    binding_hash: str | None = None  # sha256 of (tool, arguments, resource, nonce)
    nonce: str | None = None
    approval_id: str | None = None  # the human approval this grant rests on (guarded/unsafe)
    remembered: bool = False  # issued from a session approval, without asking again
    remember: Remember = "once"  # "session": this grant's approval also covers later calls
    signer: str = ""  # public nkey of the policy handler
    signature: str = ""


class GrantDenied(Event, frozen=True, tag="grant.denied"):
    call_id: str
    tool: str
    reason: str
    rule: str | None = None
    tier: RiskTier = "deny"
    approval_id: str | None = None


class GrantRevoked(Event, frozen=True, tag="grant.revoked"):
    grant_id: str
    reason: str
    call_id: str | None = None


class ApprovalRequested(Event, frozen=True, tag="approval.requested"):
    approval_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    tier: RiskTier
    reason: str
    expires_at: datetime
    rule: str | None = None
    capabilities: list[Capability] = []
    binding_hash: str = ""
    nonce: str = ""
    # "session" is offered for Guarded calls only
    options: list[Remember] = msgspec.field(default_factory=lambda: ["once"])
    # "budget": not a tool call but a run over a spending cap asking for more; then ``call_id``
    # is the ``budget.exceeded`` event's id, ``tool`` is "budget" and ``arguments`` say which
    # cap, what was spent and what an approval adds (the policy answers ``budget.raised`` /
    # ``budget.refused`` instead of a grant)
    # "plan_step": a planning run's step approved as a whole (handlers/plan_approval.py); then
    # ``call_id`` is the approval's own id, ``tool`` is "plan_step", ``arguments`` the step
    about: Literal["tool_call", "budget", "plan_step"] = "tool_call"


class ApprovalGranted(Event, frozen=True, tag="approval.granted"):
    approval_id: str
    approver: str
    remember: Remember = "once"
    binding_hash: str = ""  # must equal the request's: an approval answers one call only
    signer: str = ""  # public nkey of the approver
    signature: str = ""


class ApprovalDenied(Event, frozen=True, tag="approval.denied"):
    approval_id: str
    approver: str
    reason: str = ""
    binding_hash: str = ""
    signer: str = ""
    signature: str = ""


class ApprovalExpired(Event, frozen=True, tag="approval.expired"):
    approval_id: str
    call_id: str | None = None


class SecurityRejected(Event, frozen=True, tag="security.rejected"):
    """A handler refused an event it cannot trust (bad signer, bad signature, a replayed or
    mismatched approval). The refused event changes nothing; this records that it was tried."""

    rejected_id: str
    rejected_type: str
    reason: str
    call_id: str | None = None
    approval_id: str | None = None
    signer: str | None = None
