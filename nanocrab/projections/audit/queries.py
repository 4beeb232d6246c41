"""Reading the audit: calls, pending approvals, violations."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    select,
)
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.projections.audit.rows import (
    _from_row,
    _load_approval,
    _load_call,
)
from nanocrab.projections.audit.tables import (
    NO_RUN,
    audit_approvals,
    audit_invocations,
    audit_violations,
)
from nanocrab.projections.db import as_utc


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One tool call as the audit sees it (JSON columns decoded; times in UTC).

    A call is ``(run_id, call_id)``: the call id comes from the model provider and may repeat
    in another run. ``approval_run_id`` is the run that asked for ``approval_id`` (the call's
    own, or for a remembered grant the run where the session approval was given)."""

    call_id: str
    trace_id: str | None
    task_id: str | None
    run_id: str | None
    step_id: str | None
    session_id: str | None
    tool: str | None
    arguments: dict[str, Any] | None
    requested_capabilities: list[dict[str, Any]]
    granted_capabilities: list[dict[str, Any]]
    tier: str | None
    rule: str | None
    grant_id: str | None
    approval_required: bool
    approval_id: str | None
    approval_result: str | None
    approver: str | None
    requested_at: datetime
    start_at: datetime | None
    end_at: datetime | None
    status: str
    error: str | None
    error_source: str | None
    error_kind: str | None
    outcome: str | None
    grant_denied: bool
    remembered: bool
    revoked: bool
    approval_run_id: str | None
    backend: str | None = None  # the operations backend it ran on (ssh:<name>); None: local
    # who published its result: the executor (tool.completed) or the orchestrator (its own
    # tools' results and refusals of calls the guardrails blocked: tool.resolved)
    settled_by: str | None = None

    @property
    def duration_ms(self) -> float | None:
        """From the (first) start to the completion; ``None`` unless both are known."""
        if self.start_at is None or self.end_at is None:
            return None
        return round((self.end_at - self.start_at).total_seconds() * 1000, 3)


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    """One approval request and the answer that counts (``status`` ``pending`` until one);
    it is ``(run_id, approval_id)``, as approval ids repeat where call ids do."""

    approval_id: str
    run_id: str | None
    session_id: str | None
    call_id: str | None
    tool: str | None
    arguments: dict[str, Any] | None
    tier: str | None
    rule: str | None
    reason: str | None
    binding_hash: str | None
    options: list[str]
    requested_at: datetime | None
    expires_at: datetime | None
    status: str
    approver: str | None
    signer: str | None
    remember: str | None
    answered_at: datetime | None
    answer_reason: str | None


@dataclass(frozen=True, slots=True)
class ViolationRow:
    """One ``security.rejected``: what was refused, by which handler (``source``), and why."""

    id: str
    time: datetime
    run_id: str | None
    session_id: str | None
    call_id: str | None
    approval_id: str | None
    rejected_type: str
    rejected_id: str
    signer: str | None
    reason: str
    source: str


def _utc(value: datetime) -> datetime:
    return as_utc(value).astimezone(UTC)


def _run(run_id: str | None) -> str | None:
    return None if run_id == NO_RUN else run_id


def _audit_row(row: Any) -> AuditRow:
    call = _load_call(row)
    values = {f.name: getattr(call, f.name) for f in fields(AuditRow)}
    values["run_id"], values["approval_run_id"] = _run(call.run_id), _run(call.approval_run_id)
    return AuditRow(**values)


def _approval_row(row: Any) -> ApprovalRow:
    a = _load_approval(row)
    values = {f.name: getattr(a, f.name) for f in fields(ApprovalRow)}
    values["run_id"] = _run(a.run_id)
    return ApprovalRow(**values)


async def audit_rows(
    engine: AsyncEngine,
    *,
    run_id: str | None = None,
    call_id: str | None = None,
    tool: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    limit: int = 1000,
) -> list[AuditRow]:
    """Tool calls matching every given filter (``since``: requested at or after), oldest first;
    the newest ``limit`` when more match. ``call_id`` alone may match calls of several runs."""
    t = audit_invocations
    query = select(t)
    if run_id is not None:
        query = query.where(t.c.run_id == run_id)
    if call_id is not None:
        query = query.where(t.c.call_id == call_id)
    if tool is not None:
        query = query.where(t.c.tool == tool)
    if status is not None:
        query = query.where(t.c.status == status)
    if since is not None:
        query = query.where(t.c.requested_at >= _utc(since))
    newest = (t.c.requested_at.desc(), t.c.call_id.desc(), t.c.run_id.desc())
    query = query.order_by(*newest).limit(limit)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [_audit_row(r) for r in reversed(rows)]


async def pending_approvals(
    engine: AsyncEngine, *, now: datetime | None = None
) -> list[ApprovalRow]:
    """Requested, unanswered and not yet expired at ``now`` (default: the current time)."""
    t = audit_approvals
    query = (
        select(t)
        .where(t.c.status == "pending")
        .where(t.c.requested_at.is_not(None))
        .where(t.c.expires_at > _utc(now or datetime.now(UTC)))
        .order_by(t.c.requested_at, t.c.approval_id, t.c.run_id)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [_approval_row(r) for r in rows]


async def approval_row(
    engine: AsyncEngine, approval_id: str, *, prefix: bool = True
) -> ApprovalRow | None:
    """The approval with this id, or (``prefix``) the only one whose id starts with it; else
    ``None``. The gateway asks for exact ids: a prefix is a person's shorthand at a terminal,
    and over HTTP it would let a request that cannot see the list guess its way to an entry.

    Approval ids of older logs repeat where call ids do (the policy derived them from the call
    id; now from the call's ``tool.requested``, unique to the run): when
    several runs asked for the same id, the one still pending among them, if only one is."""
    if not approval_id:
        return None
    t = audit_approvals
    escaped = approval_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    async with engine.connect() as conn:
        known = select(t.c.approval_id).where(t.c.approval_id == approval_id).limit(1)
        if await conn.scalar(known) is None:
            if not prefix:
                return None
            like = t.c.approval_id.like(f"{escaped}%", escape="\\")
            ids = await conn.execute(select(t.c.approval_id).where(like).distinct().limit(2))
            found = ids.scalars().all()
            if len(found) != 1:
                return None  # none, or a prefix of several ids
            approval_id = found[0]
        exact = await conn.execute(select(t).where(t.c.approval_id == approval_id))
        rows = exact.mappings().all()
    if len(rows) > 1:
        rows = [r for r in rows if r["status"] == "pending"]
    return _approval_row(rows[0]) if len(rows) == 1 else None


async def violations(
    engine: AsyncEngine, *, run_id: str | None = None, since: datetime | None = None
) -> list[ViolationRow]:
    """Refused forgeries (``security.rejected``), oldest first."""
    t = audit_violations
    query = select(t)
    if run_id is not None:
        query = query.where(t.c.run_id == run_id)
    if since is not None:
        query = query.where(t.c.time >= _utc(since))
    async with engine.connect() as conn:
        rows = (await conn.execute(query.order_by(t.c.time, t.c.id))).mappings().all()
    return [ViolationRow(**{**_from_row(r), "run_id": _run(r["run_id"])}) for r in rows]
