"""The audit tables and what they keep."""

from __future__ import annotations

from typing import Literal, get_args

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Index,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    BudgetExceeded,
    BudgetRaised,
    BudgetRefused,
    GrantDenied,
    GrantIssued,
    GrantRevoked,
    GuardrailChecked,
    SecurityRejected,
    ToolCompleted,
    ToolRequested,
    ToolSkipped,
    ToolStarted,
)
from nanocrab.projections.db import applied_events, metadata

AuditStatus = Literal[
    "requested", "awaiting_approval", "granted", "denied", "running", "completed", "failed",
    "refused", "skipped", "revoked",
]  # fmt: skip
STATUSES: tuple[str, ...] = get_args(AuditStatus)

ERROR_CHARS = 500
"""Tool error text kept per call (the full result stays in the log)."""
ARGUMENT_STRING_CHARS = 1000
"""Longer string arguments are cut (the JSON stays valid); the log keeps them whole."""

NO_RUN = ""
"""The ``run_id`` stored for an event that names no run (a key column cannot be null)."""

audit_invocations = Table(
    "audit_invocations",
    metadata,
    # a call id comes from the model provider and may repeat in another run (a provider that
    # numbers calls per run, a rerun): a call is its run's call id, never the id alone
    Column("call_id", String(128), nullable=False),
    Column("trace_id", String(32)),
    Column("task_id", String(128)),
    Column("run_id", String(128), nullable=False),
    Column("step_id", String(128)),
    Column("session_id", String(128)),
    Column("tool", String(128)),
    Column("arguments", Text),  # JSON object, long strings cut
    Column("requested_capabilities", Text, nullable=False),  # JSON [{tool, resource, access}]
    Column("granted_capabilities", Text, nullable=False),  # JSON, as above
    Column("tier", String(16)),
    Column("rule", String(128)),
    Column("grant_id", String(128)),
    Column("grant_event_id", String(64)),  # the grant.issued believed; a rejected one is undone
    Column("approval_required", Boolean, nullable=False),
    Column("approval_id", String(128)),
    # the run that asked for that approval: the call's own, or an earlier run of the session
    # whose approval a remembered grant rests on
    Column("approval_run_id", String(128)),
    Column("approval_result", String(16)),  # pending/granted/denied/expired/remembered
    Column("approver", String(300)),  # "name [signer public key]"
    Column("requested_at", DateTime(timezone=True), nullable=False),  # earliest event of the call
    Column("start_at", DateTime(timezone=True)),  # first tool.started
    Column("end_at", DateTime(timezone=True)),  # tool.completed
    Column("status", String(24), nullable=False),
    Column("error", Text),
    Column("error_source", String(16)),  # tool, grant, approval, revoke, security
    Column("error_kind", String(32)),  # ToolCompleted.error_kind
    Column("outcome", String(16)),  # fact: completed/failed/refused/skipped (first wins)
    Column("grant_denied", Boolean, nullable=False),  # fact: a grant.denied was seen
    Column("remembered", Boolean, nullable=False),  # fact: granted from a session approval
    Column("revoked", Boolean, nullable=False),
    Column("backend", String(64)),  # tool.started.backend: ssh:<name>; null: the executor's host
    Column("settled_by", String(16)),  # executor (tool.completed) / orchestrator (tool.resolved)
    Column("guardrail_blocked", Boolean, nullable=False),  # a tool_call verdict blocked it
    # call id first: the key's index also serves a lookup by call id alone
    PrimaryKeyConstraint("call_id", "run_id"),
    Index("ix_audit_invocations_run", "run_id", "requested_at"),
    Index("ix_audit_invocations_time", "requested_at"),
    Index("ix_audit_invocations_grant", "grant_id"),
    Index("ix_audit_invocations_approval", "approval_id"),
)

audit_approvals = Table(
    "audit_approvals",
    metadata,
    # approval ids were minted by the policy from the call id (older logs repeat them where call
    # ids repeat; now they derive from the call's tool.requested)
    Column("approval_id", String(128), nullable=False),
    Column("run_id", String(128), nullable=False),
    Column("session_id", String(128)),
    Column("call_id", String(128)),
    Column("tool", String(128)),
    Column("arguments", Text),
    Column("tier", String(16)),
    Column("rule", String(128)),
    Column("reason", Text),
    Column("binding_hash", String(128)),
    Column("options", Text, nullable=False),  # JSON list: "once", "session"
    Column("requested_at", DateTime(timezone=True)),  # null until approval.requested is seen
    Column("expires_at", DateTime(timezone=True)),
    Column("status", String(16), nullable=False),
    Column("approver", String(200)),
    Column("signer", String(128)),
    Column("remember", String(16)),
    Column("answered_at", DateTime(timezone=True)),
    Column("answer_reason", Text),
    Column("answers", Text, nullable=False),  # JSON: every answer in log order (facts)
    Column("rejected", Text, nullable=False),  # JSON: ids of answers security.rejected refused
    PrimaryKeyConstraint("approval_id", "run_id"),
    Index("ix_audit_approvals_status", "status", "expires_at"),
)

audit_violations = Table(
    "audit_violations",
    metadata,
    Column("id", String(64), primary_key=True),  # the security.rejected event's id
    Column("time", DateTime(timezone=True), nullable=False),
    Column("run_id", String(128)),
    Column("session_id", String(128)),
    Column("call_id", String(128)),
    Column("approval_id", String(128)),
    Column("rejected_type", String(64), nullable=False),
    Column("rejected_id", String(64), nullable=False),
    Column("signer", String(128)),
    Column("reason", Text, nullable=False),
    Column("source", String(128), nullable=False),  # the handler that refused
    Index("ix_audit_violations_time", "time"),
    Index("ix_audit_violations_run", "run_id"),
)

audit_revocations = Table(
    "audit_revocations",
    metadata,
    Column("grant_id", String(128), nullable=False),
    Column("run_id", String(128), nullable=False),  # grant ids repeat where call ids do
    Column("call_id", String(128)),
    Column("reason", Text, nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("grant_id", "run_id"),
)

audit_events = applied_events("audit")
"""Every audited event applied, by id: a second copy of one changes nothing."""

_AUDITED = (
    ToolRequested, GrantIssued, GrantDenied, GrantRevoked, ToolStarted, ToolCompleted, ToolSkipped,
    ApprovalRequested, ApprovalGranted, ApprovalDenied, ApprovalExpired, SecurityRejected,
    BudgetExceeded, BudgetRaised, BudgetRefused,
)  # fmt: skip


def _audited(e: object) -> bool:
    """An event that changes the audit: :data:`_AUDITED`, and a verdict that blocked a tool
    call (what an orchestrator's refusal of the call must stand on)."""
    return isinstance(e, _AUDITED) or (
        isinstance(e, GuardrailChecked) and e.checkpoint == "tool_call"
        and e.action in ("block", "redact")
    )  # fmt: skip

_ERROR_RANK = {"security": 0, "revoke": 1, "approval": 2, "grant": 3, "tool": 4}
"""Which explanation a call's ``error`` shows when several apply: the most decisive one."""
