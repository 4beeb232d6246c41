"""Grants (minted only by the policy handler) and human approvals."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from nanocrab.events.base import Event
from nanocrab.events.values import Capability, GrantScope, RiskTier


class GrantIssued(Event, frozen=True, tag="grant.issued"):
    grant_id: str
    call_id: str
    tool: str
    capabilities: list[Capability]
    scope: GrantScope
    tier: RiskTier
    expires_at: datetime
    binding_hash: str | None = None  # sha256 of (tool, arguments, resource) for guarded/unsafe
    nonce: str | None = None
    signer: str = ""  # public nkey of the policy handler
    signature: str = ""


class GrantDenied(Event, frozen=True, tag="grant.denied"):
    call_id: str
    tool: str
    reason: str
    rule: str | None = None


class GrantRevoked(Event, frozen=True, tag="grant.revoked"):
    grant_id: str
    reason: str


class ApprovalRequested(Event, frozen=True, tag="approval.requested"):
    approval_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    tier: RiskTier
    reason: str
    expires_at: datetime


class ApprovalGranted(Event, frozen=True, tag="approval.granted"):
    approval_id: str
    approver: str
    remember: Literal["once", "session"] = "once"
    signature: str = ""


class ApprovalDenied(Event, frozen=True, tag="approval.denied"):
    approval_id: str
    approver: str
    reason: str = ""


class ApprovalExpired(Event, frozen=True, tag="approval.expired"):
    approval_id: str
