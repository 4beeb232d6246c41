"""Folding a batch of events into the audit rows it touches; the projection itself."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from nanocrab.bus import Stored, Subjects
from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    BudgetExceeded,
    BudgetRaised,
    BudgetRefused,
    Event,
    GrantDenied,
    GrantIssued,
    GrantRevoked,
    GuardrailChecked,
    SecurityRejected,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolResolved,
    ToolSkipped,
    ToolStarted,
)
from nanocrab.events.tools import orchestrator_may_resolve
from nanocrab.projections.audit.budgets import audit_budgets, budget_answer, budget_row
from nanocrab.projections.audit.rows import (
    Key,
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
    _select_keys,
    trace_id_of,
)
from nanocrab.projections.audit.tables import (
    ERROR_CHARS,
    NO_RUN,
    _audited,
    audit_approvals,
    audit_events,
    audit_invocations,
    audit_revocations,
    audit_violations,
)
from nanocrab.projections.db import first_copies


def _run(e: Event) -> str:
    return e.run_id or NO_RUN


class _Fold:
    """The rows one batch touches, loaded up front, then folded event by event.

    Every map is keyed by ``(run_id, id)`` (:data:`Key`): a call, an approval, a grant or a
    revocation belongs to one run, whatever ids another run used."""

    def __init__(self) -> None:
        self.calls: dict[Key, _Call] = {}
        self.approvals: dict[Key, _Approval] = {}
        self.revocations: dict[Key, dict[str, Any]] = {}  # by (run, grant id)
        self.violations: dict[str, dict[str, Any]] = {}
        self.budgets: dict[str, dict[str, Any]] = {}  # by budget.exceeded id
        self.by_grant: dict[Key, Key] = {}  # (run, grant id) -> the call
        self.by_approval: dict[Key, set[Key]] = {}  # (its run, approval id) -> the calls on it
        self.dirty_calls: set[Key] = set()
        self.dirty_approvals: set[Key] = set()
        self.dirty_revocations: set[Key] = set()

    async def load(self, conn: AsyncConnection, events: Sequence[Event]) -> None:
        call_keys: set[Key] = set()
        grant_keys: set[Key] = set()
        approval_keys: set[Key] = set()
        remembered: set[str] = set()  # approvals a session grant rests on, asked in any run
        for e in events:
            run = _run(e)
            if (cid := getattr(e, "call_id", None)) is not None:
                call_keys.add((run, cid))
            if isinstance(e, GuardrailChecked):  # a blocked call's verdict (``_audited``)
                call_keys.add((run, e.target_id))
            if (gid := getattr(e, "grant_id", None)) is not None:
                grant_keys.add((run, gid))
            if (aid := getattr(e, "approval_id", None)) is not None:
                approval_keys.add((run, aid))
                if isinstance(e, GrantIssued) and e.remembered:
                    remembered.add(aid)
        for column, keys, run_column in (
            ("call_id", call_keys, "run_id"), ("grant_id", grant_keys, "run_id"),
            ("approval_id", approval_keys, "approval_run_id"),
        ):  # fmt: skip
            for row in await _select_keys(conn, audit_invocations, column, keys, run_column):
                if (row["run_id"], row["call_id"]) not in self.calls:
                    self._index(_load_call(row))
        approval_keys |= {k for c in self.calls.values() if (k := c.approval_key) is not None}
        for row in [
            *await _select_keys(conn, audit_approvals, "approval_id", approval_keys),
            *await _select_in(conn, audit_approvals, "approval_id", remembered),
        ]:
            if (row["run_id"], row["approval_id"]) not in self.approvals:
                approval = _load_approval(row)
                self.approvals[approval.key] = approval
        for row in await _select_keys(conn, audit_revocations, "grant_id", grant_keys):
            self.revocations[(row["run_id"], row["grant_id"])] = _from_row(row)
        stops = {e.exceeded_id for e in events if isinstance(e, BudgetRaised | BudgetRefused)}
        for row in await _select_in(conn, audit_budgets, "id", stops):
            self.budgets[row["id"]] = dict(row)

    def _index(self, call: _Call) -> None:
        self.calls[call.key] = call
        if call.grant_id:
            self.by_grant[(call.run_id, call.grant_id)] = call.key
        if (approval := call.approval_key) is not None:
            self.by_approval.setdefault(approval, set()).add(call.key)

    def call(self, key: Key, e: Event) -> _Call:
        """The call's row (created from what ``e`` says when unknown), marked for writing."""
        c = self.calls.get(key)
        if c is None:
            c = _Call(call_id=key[1], run_id=key[0], requested_at=e.time)
            self.calls[key] = c
        c.requested_at = min(c.requested_at, e.time)
        c.task_id = c.task_id or e.task_id
        c.step_id = c.step_id or e.step_id
        c.session_id = c.session_id or e.session_id
        c.trace_id = c.trace_id or trace_id_of(e.trace)
        c.tool = c.tool or getattr(e, "tool", None)
        self.dirty_calls.add(key)
        return c

    def approval(self, key: Key, e: Event) -> _Approval:
        a = self.approvals.get(key)
        if a is None:
            a = self.approvals[key] = _Approval(approval_id=key[1], run_id=key[0])
        a.session_id = a.session_id or e.session_id
        self.dirty_approvals.add(key)
        return a

    def link_grant(self, c: _Call, grant_id: str) -> None:
        c.grant_id = c.grant_id or grant_id
        self.by_grant[(c.run_id, grant_id)] = c.key
        if (revocation := self.revocations.get((c.run_id, grant_id))) is not None:
            c.revoked = True
            c.set_error("revoke", f"grant revoked: {revocation['reason']}")

    def link_approval(self, c: _Call, approval_id: str, *, remembered: bool = False) -> None:
        c.approval_id = approval_id
        c.approval_run_id = self._approval_run(c, approval_id) if remembered else c.run_id
        assert c.approval_key is not None
        self.by_approval.setdefault(c.approval_key, set()).add(c.key)

    def _approval_run(self, c: _Call, approval_id: str) -> str:
        """The run that asked for the session approval a remembered grant of ``c`` rests on:
        its own if it asked, else an earlier run of the session (or, for a rule that shares
        its approvals with subagents, the parent's). Approval ids repeat where call ids do, so
        among several: one granted for the session, then one of the call's session, then the
        latest asked (all of them folded before this grant, so a rebuild picks the same)."""
        if (c.run_id, approval_id) in self.approvals:
            return c.run_id
        asked = [
            a for a in self.approvals.values()
            if a.approval_id == approval_id and a.requested_at is not None
        ]  # fmt: skip
        if not asked:
            return c.run_id

        def rank(a: _Approval) -> tuple[bool, bool, datetime, str]:
            answer = a.answer()
            for_session = answer is not None and answer.remember == "session"
            assert a.requested_at is not None
            return (for_session, a.session_id == c.session_id, a.requested_at, a.run_id)

        return max(asked, key=rank).run_id

    def _forget_grant(self, c: _Call) -> None:
        """A grant the executor refused as forged never was: back to what the policy said."""
        c.grant_event_id = c.grant_id = None
        c.granted_capabilities, c.remembered = [], False
        key = c.approval_key
        request = self.approvals.get(key) if key is not None else None
        c.tier = request.tier if request is not None else None
        c.rule = request.rule if request is not None else None

    def answered(self, key: Key) -> None:
        self.dirty_calls |= self.by_approval.get(key, set())

    def apply(self, e: Event) -> None:
        run = _run(e)
        match e:
            case ToolRequested():
                known = self.calls.get((run, e.call_id))
                if known is not None and known.arguments is not None:
                    return  # the first request stands (the policy decided on it, not a later one)
                c = self.call((run, e.call_id), e)
                c.tool = e.tool
                c.trace_id = trace_id_of(e.trace) or c.trace_id
                c.arguments = _cut(e.arguments)
                c.requested_capabilities = _caps(e.capabilities)
            case GrantIssued():
                c = self.call((run, e.call_id), e)
                c.tool = e.tool  # what the policy decided on (a request it refused may differ)
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
                    self.link_approval(c, e.approval_id, remembered=e.remembered)
            case GrantDenied():
                c = self.call((run, e.call_id), e)
                c.grant_denied = True
                c.tier, c.rule = e.tier, e.rule or c.rule
                c.set_error("grant", e.reason)
                if e.approval_id:
                    self.link_approval(c, e.approval_id)
            case GrantRevoked():
                grant_key = (run, e.grant_id)
                if grant_key not in self.revocations:
                    self.revocations[grant_key] = {
                        "grant_id": e.grant_id, "run_id": run, "call_id": e.call_id,
                        "reason": e.reason, "time": e.time,
                    }  # fmt: skip
                    self.dirty_revocations.add(grant_key)
                key = (run, e.call_id) if e.call_id else self.by_grant.get(grant_key)
                if key is not None:
                    c = self.call(key, e)
                    c.revoked = True
                    c.set_error("revoke", f"grant revoked: {e.reason}")
                    self.link_grant(c, e.grant_id)
            case ToolStarted():
                c = self.call((run, e.call_id), e)
                c.start_at = min(c.start_at or e.time, e.time)
                c.backend = e.backend or c.backend
                if e.grant_id:
                    self.link_grant(c, e.grant_id)
            case GuardrailChecked():  # only tool_call blocks reach the fold (``_audited``)
                self.call((run, e.target_id), e).guardrail_blocked = True
            case ToolResolved():
                c = self.call((run, e.call_id), e)
                granted = c.tool if c.grant_event_id is not None else None
                requested = c.arguments is not None
                if c.outcome is None and orchestrator_may_resolve(
                    e, granted_tool=granted, requested=requested, blocked=c.guardrail_blocked
                ):
                    _settle(c, e, "orchestrator")
            case ToolCompleted():
                c = self.call((run, e.call_id), e)
                # the executor's result outranks the orchestrator's: the call ran after all
                if c.outcome is None or c.settled_by == "orchestrator":
                    _settle(c, e, "executor")
            case ToolSkipped():
                c = self.call((run, e.call_id), e)
                if c.outcome is None:
                    c.outcome = "skipped"
                    c.set_error("tool", f"skipped: {e.reason}")
            case ApprovalRequested():
                a = self.approval((run, e.approval_id), e)
                a.call_id, a.tool, a.arguments = e.call_id, e.tool, _cut(e.arguments)
                a.tier, a.rule, a.reason = e.tier, e.rule, e.reason
                a.binding_hash, a.options = e.binding_hash or None, list(e.options)
                a.requested_at, a.expires_at = e.time, e.expires_at
                if e.about == "budget":
                    return  # a run over budget asking for more: no tool call (audit_budgets)
                c = self.call((run, e.call_id), e)
                c.tier, c.rule = c.tier or e.tier, c.rule or e.rule
                if not c.requested_capabilities:  # what the person is asked to allow
                    c.requested_capabilities = _caps(e.capabilities)
                if c.arguments is None:
                    c.arguments = _cut(e.arguments)
                self.link_approval(c, e.approval_id)
            case ApprovalGranted():
                self.approval((run, e.approval_id), e).add(
                    _Answer(
                        id=e.id, kind="granted", time=e.time, approver=e.approver,
                        signer=e.signer or None, remember=e.remember,
                    )
                )  # fmt: skip
                self.answered((run, e.approval_id))
            case ApprovalDenied():
                self.approval((run, e.approval_id), e).add(
                    _Answer(
                        id=e.id, kind="denied", time=e.time, approver=e.approver,
                        signer=e.signer or None, reason=e.reason or None,
                    )
                )  # fmt: skip
                self.answered((run, e.approval_id))
            case ApprovalExpired():
                expired = _Answer(id=e.id, kind="expired", time=e.time)
                self.approval((run, e.approval_id), e).add(expired)
                if e.call_id:
                    self.link_approval(self.call((run, e.call_id), e), e.approval_id)
                self.answered((run, e.approval_id))
            case SecurityRejected():
                self.violations[e.id] = {
                    "id": e.id, "time": e.time, "run_id": e.run_id, "session_id": e.session_id,
                    "call_id": e.call_id, "approval_id": e.approval_id,
                    "rejected_type": e.rejected_type, "rejected_id": e.rejected_id,
                    "signer": e.signer, "reason": e.reason, "source": e.source,
                }  # fmt: skip
                approval_key = (run, e.approval_id or "")
                if e.approval_id and (approval := self.approvals.get(approval_key)) is not None:
                    if e.rejected_id not in approval.rejected:
                        approval.rejected.append(e.rejected_id)
                    self.dirty_approvals.add(approval_key)
                    self.answered(approval_key)
                if e.call_id and (run, e.call_id) in self.calls:  # a forgery creates no call
                    c = self.call((run, e.call_id), e)
                    c.set_error("security", f"rejected: {e.reason}")
                    if e.rejected_type == "grant.issued" and c.grant_event_id == e.rejected_id:
                        self._forget_grant(c)
            case BudgetExceeded():
                self.budgets[e.id] = budget_row(e)
            case BudgetRaised() | BudgetRefused():
                if (row := self.budgets.get(e.exceeded_id)) is not None:
                    budget_answer(row, e)
            case _:
                pass

    async def write(self, conn: AsyncConnection) -> None:
        for key in self.dirty_approvals:
            self.approvals[key].derive()
            self.dirty_calls |= self.by_approval.get(key, set())
        for key in self.dirty_calls:
            c = self.calls[key]
            approval = c.approval_key
            c.derive(self.approvals.get(approval) if approval is not None else None)
        await _replace(
            conn,
            audit_invocations,
            ("call_id", "run_id"),
            [self.calls[k].row() for k in self.dirty_calls],
        )
        await _replace(
            conn,
            audit_approvals,
            ("approval_id", "run_id"),
            [self.approvals[k].row() for k in self.dirty_approvals],
        )
        await _replace(
            conn,
            audit_revocations,
            ("grant_id", "run_id"),
            [self.revocations[k] for k in self.dirty_revocations],
        )
        await _replace(conn, audit_violations, ("id",), list(self.violations.values()))
        await _replace(conn, audit_budgets, ("id",), list(self.budgets.values()))


class AuditProjection:
    name = "audit"
    tables = (
        audit_invocations, audit_approvals, audit_violations, audit_revocations, audit_events,
        audit_budgets,
    )  # fmt: skip
    lazy_checkpoint_s = 1.0
    gather_s = 0.1  # a run's calls land in a few transactions, not one per event

    @staticmethod
    def relevant(stored: Stored) -> bool:
        """Only tool, grant, approval and security events change the audit."""
        return _audited(stored.event)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.*.run.>"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        # each event once by id: a second copy (say a grant.issued re-sent after the
        # security.rejected that refused it) must not fold again
        audited = [s for s in batch if _audited(s.event)]
        events = [s.event for s in await first_copies(conn, audit_events, audited) if s.event]
        fold = _Fold()
        await fold.load(conn, events)
        for e in events:
            fold.apply(e)
        await fold.write(conn)


def _settle(c: _Call, e: ToolCompleted, by: str) -> None:
    """``e`` as the call's result; one published before by the orchestrator is replaced."""
    if c.settled_by == "orchestrator":
        c.outcome = None
        if c.error_source == "tool":
            c.error = c.error_source = None
    c.end_at, c.error_kind, c.settled_by = e.time, e.error_kind, by
    if e.error_kind == "denied":
        c.outcome = "refused"
    else:
        c.outcome = "failed" if e.is_error else "completed"
    if e.is_error:
        text = " ".join(b.text for b in e.content if isinstance(b, TextBlock))
        c.set_error("tool", text[:ERROR_CHARS] or (e.error_kind or "error"))
