"""Folding a batch of events into the audit rows it touches; the projection itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from nanocrab.bus import Stored, Subjects
from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    GrantDenied,
    GrantIssued,
    GrantRevoked,
    SecurityRejected,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolSkipped,
    ToolStarted,
)
from nanocrab.projections.audit.rows import (
    _Answer,
    _Approval,
    _Call,
    _caps,
    _cut,
    _from_row,
    _load_approval,
    _load_call,
    _replace,
    _select_in,
    trace_id_of,
)
from nanocrab.projections.audit.tables import (
    _AUDITED,
    ERROR_CHARS,
    audit_approvals,
    audit_events,
    audit_invocations,
    audit_revocations,
    audit_violations,
)
from nanocrab.projections.db import first_copies


class _Fold:
    """The rows one batch touches, loaded up front, then folded event by event."""

    def __init__(self) -> None:
        self.calls: dict[str, _Call] = {}
        self.approvals: dict[str, _Approval] = {}
        self.revocations: dict[str, dict[str, Any]] = {}
        self.violations: dict[str, dict[str, Any]] = {}
        self.by_grant: dict[str, str] = {}
        self.by_approval: dict[str, set[str]] = {}
        self.dirty_calls: set[str] = set()
        self.dirty_approvals: set[str] = set()
        self.dirty_revocations: set[str] = set()

    async def load(self, conn: AsyncConnection, events: Sequence[Event]) -> None:
        call_ids: set[str] = set()
        grant_ids: set[str] = set()
        approval_ids: set[str] = set()
        for e in events:
            if (cid := getattr(e, "call_id", None)) is not None:
                call_ids.add(cid)
            if (gid := getattr(e, "grant_id", None)) is not None:
                grant_ids.add(gid)
            if (aid := getattr(e, "approval_id", None)) is not None:
                approval_ids.add(aid)
        for column, keys in (
            ("call_id", call_ids), ("grant_id", grant_ids), ("approval_id", approval_ids),
        ):  # fmt: skip
            for row in await _select_in(conn, audit_invocations, column, keys):
                if row["call_id"] not in self.calls:
                    self._index(_load_call(row))
        approval_ids |= {c.approval_id for c in self.calls.values() if c.approval_id}
        for row in await _select_in(conn, audit_approvals, "approval_id", approval_ids):
            self.approvals[row["approval_id"]] = _load_approval(row)
        for row in await _select_in(conn, audit_revocations, "grant_id", grant_ids):
            self.revocations[row["grant_id"]] = _from_row(row)

    def _index(self, call: _Call) -> None:
        self.calls[call.call_id] = call
        if call.grant_id:
            self.by_grant[call.grant_id] = call.call_id
        if call.approval_id:
            self.by_approval.setdefault(call.approval_id, set()).add(call.call_id)

    def call(self, call_id: str, e: Event) -> _Call:
        """The call's row (created from what ``e`` says when unknown), marked for writing."""
        c = self.calls.get(call_id)
        if c is None:
            c = _Call(call_id=call_id, requested_at=e.time)
            self.calls[call_id] = c
        c.requested_at = min(c.requested_at, e.time)
        c.task_id = c.task_id or e.task_id
        c.run_id = c.run_id or e.run_id
        c.step_id = c.step_id or e.step_id
        c.session_id = c.session_id or e.session_id
        c.trace_id = c.trace_id or trace_id_of(e.trace)
        c.tool = c.tool or getattr(e, "tool", None)
        self.dirty_calls.add(call_id)
        return c

    def approval(self, approval_id: str, e: Event) -> _Approval:
        a = self.approvals.get(approval_id)
        if a is None:
            a = self.approvals[approval_id] = _Approval(approval_id=approval_id)
        a.run_id = a.run_id or e.run_id
        a.session_id = a.session_id or e.session_id
        self.dirty_approvals.add(approval_id)
        return a

    def link_grant(self, c: _Call, grant_id: str) -> None:
        c.grant_id = c.grant_id or grant_id
        self.by_grant[grant_id] = c.call_id
        if (revocation := self.revocations.get(grant_id)) is not None:
            c.revoked = True
            c.set_error("revoke", f"grant revoked: {revocation['reason']}")

    def link_approval(self, c: _Call, approval_id: str) -> None:
        c.approval_id = approval_id
        self.by_approval.setdefault(approval_id, set()).add(c.call_id)

    def _forget_grant(self, c: _Call) -> None:
        """A grant the executor refused as forged never was: back to what the policy said."""
        c.grant_event_id = c.grant_id = None
        c.granted_capabilities, c.remembered = [], False
        request = self.approvals.get(c.approval_id) if c.approval_id else None
        c.tier = request.tier if request is not None else None
        c.rule = request.rule if request is not None else None

    def answered(self, approval_id: str) -> None:
        self.dirty_calls |= self.by_approval.get(approval_id, set())

    def apply(self, e: Event) -> None:
        match e:
            case ToolRequested():
                if (known := self.calls.get(e.call_id)) is not None and known.arguments is not None:
                    return  # the first request stands (the policy decided on it, not a later one)
                c = self.call(e.call_id, e)
                c.tool = e.tool
                c.trace_id = trace_id_of(e.trace) or c.trace_id
                c.arguments = _cut(e.arguments)
                c.requested_capabilities = _caps(e.capabilities)
            case GrantIssued():
                c = self.call(e.call_id, e)
                # believed until a security.rejected names it (the projection cannot verify
                # signatures; the executor does, and says so)
                c.grant_event_id = e.id
                c.granted_capabilities = _caps(e.capabilities)
                if not c.requested_capabilities:  # what the policy found the call needs
                    c.requested_capabilities = _caps(e.capabilities)
                c.tier, c.rule = e.tier, e.rule or c.rule
                c.remembered = c.remembered or e.remembered
                self.link_grant(c, e.grant_id)
                if e.approval_id:
                    self.link_approval(c, e.approval_id)
            case GrantDenied():
                c = self.call(e.call_id, e)
                c.grant_denied = True
                c.tier, c.rule = e.tier, e.rule or c.rule
                c.set_error("grant", e.reason)
                if e.approval_id:
                    self.link_approval(c, e.approval_id)
            case GrantRevoked():
                if e.grant_id not in self.revocations:
                    self.revocations[e.grant_id] = {
                        "grant_id": e.grant_id, "call_id": e.call_id, "reason": e.reason,
                        "time": e.time,
                    }  # fmt: skip
                    self.dirty_revocations.add(e.grant_id)
                call_id = e.call_id or self.by_grant.get(e.grant_id)
                if call_id is not None:
                    c = self.call(call_id, e)
                    c.revoked = True
                    c.set_error("revoke", f"grant revoked: {e.reason}")
                    self.link_grant(c, e.grant_id)
            case ToolStarted():
                c = self.call(e.call_id, e)
                c.start_at = min(c.start_at or e.time, e.time)
                if e.grant_id:
                    self.link_grant(c, e.grant_id)
            case ToolCompleted():
                c = self.call(e.call_id, e)
                if c.outcome is None:
                    c.end_at, c.error_kind = e.time, e.error_kind
                    if e.error_kind == "denied":
                        c.outcome = "refused"
                    else:
                        c.outcome = "failed" if e.is_error else "completed"
                    if e.is_error:
                        text = " ".join(b.text for b in e.content if isinstance(b, TextBlock))
                        c.set_error("tool", text[:ERROR_CHARS] or (e.error_kind or "error"))
            case ToolSkipped():
                c = self.call(e.call_id, e)
                if c.outcome is None:
                    c.outcome = "skipped"
                    c.set_error("tool", f"skipped: {e.reason}")
            case ApprovalRequested():
                a = self.approval(e.approval_id, e)
                a.call_id, a.tool, a.arguments = e.call_id, e.tool, _cut(e.arguments)
                a.tier, a.rule, a.reason = e.tier, e.rule, e.reason
                a.binding_hash, a.options = e.binding_hash or None, list(e.options)
                a.requested_at, a.expires_at = e.time, e.expires_at
                c = self.call(e.call_id, e)
                c.tier, c.rule = c.tier or e.tier, c.rule or e.rule
                if not c.requested_capabilities:  # what the person is asked to allow
                    c.requested_capabilities = _caps(e.capabilities)
                if c.arguments is None:
                    c.arguments = _cut(e.arguments)
                self.link_approval(c, e.approval_id)
            case ApprovalGranted():
                self.approval(e.approval_id, e).add(
                    _Answer(
                        id=e.id, kind="granted", time=e.time, approver=e.approver,
                        signer=e.signer or None, remember=e.remember,
                    )
                )  # fmt: skip
                self.answered(e.approval_id)
            case ApprovalDenied():
                self.approval(e.approval_id, e).add(
                    _Answer(
                        id=e.id, kind="denied", time=e.time, approver=e.approver,
                        signer=e.signer or None, reason=e.reason or None,
                    )
                )  # fmt: skip
                self.answered(e.approval_id)
            case ApprovalExpired():
                self.approval(e.approval_id, e).add(_Answer(id=e.id, kind="expired", time=e.time))
                if e.call_id:
                    self.link_approval(self.call(e.call_id, e), e.approval_id)
                self.answered(e.approval_id)
            case SecurityRejected():
                self.violations[e.id] = {
                    "id": e.id, "time": e.time, "run_id": e.run_id, "session_id": e.session_id,
                    "call_id": e.call_id, "approval_id": e.approval_id,
                    "rejected_type": e.rejected_type, "rejected_id": e.rejected_id,
                    "signer": e.signer, "reason": e.reason, "source": e.source,
                }  # fmt: skip
                if e.approval_id and (approval := self.approvals.get(e.approval_id)) is not None:
                    if e.rejected_id not in approval.rejected:
                        approval.rejected.append(e.rejected_id)
                    self.dirty_approvals.add(e.approval_id)
                    self.answered(e.approval_id)
                if e.call_id and e.call_id in self.calls:  # a forgery creates no call
                    c = self.call(e.call_id, e)
                    c.set_error("security", f"rejected: {e.reason}")
                    if e.rejected_type == "grant.issued" and c.grant_event_id == e.rejected_id:
                        self._forget_grant(c)
            case _:
                pass

    async def write(self, conn: AsyncConnection) -> None:
        for aid in self.dirty_approvals:
            self.approvals[aid].derive()
            self.dirty_calls |= self.by_approval.get(aid, set())
        for cid in self.dirty_calls:
            c = self.calls[cid]
            c.derive(self.approvals.get(c.approval_id) if c.approval_id else None)
        await _replace(
            conn, audit_invocations, "call_id", [self.calls[k].row() for k in self.dirty_calls]
        )
        await _replace(
            conn,
            audit_approvals,
            "approval_id",
            [self.approvals[k].row() for k in self.dirty_approvals],
        )
        await _replace(
            conn,
            audit_revocations,
            "grant_id",
            [self.revocations[k] for k in self.dirty_revocations],
        )
        await _replace(conn, audit_violations, "id", list(self.violations.values()))


class AuditProjection:
    name = "audit"
    tables = (
        audit_invocations, audit_approvals, audit_violations, audit_revocations, audit_events,
    )  # fmt: skip
    lazy_checkpoint_s = 1.0
    gather_s = 0.1  # a run's calls land in a few transactions, not one per event

    @staticmethod
    def relevant(stored: Stored) -> bool:
        """Only tool, grant, approval and security events change the audit."""
        return isinstance(stored.event, _AUDITED)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.*.run.>"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        # each event once by id: a second copy (say a grant.issued re-sent after the
        # security.rejected that refused it) must not fold again
        audited = [s for s in batch if isinstance(s.event, _AUDITED)]
        events = [s.event for s in await first_copies(conn, audit_events, audited) if s.event]
        fold = _Fold()
        await fold.load(conn, events)
        for e in events:
            fold.apply(e)
        await fold.write(conn)
