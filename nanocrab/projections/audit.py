"""Audit: for every tool call, what was asked, what was granted, who approved, what ran, how it
ended; every human approval; every refused forgery.

Tables: ``audit_invocations`` (one row per ``call_id``), ``audit_approvals`` (one per
``approval_id``), ``audit_violations`` (one per ``security.rejected``) and ``audit_revocations``
(grant revocations, kept so a revocation that names only its grant still marks the call once
the grant is seen).

The events of one call may come in any order (a revocation before its grant, a completion for a
call never requested). Rows therefore hold *facts* (times, ids, flags, the list of answers an
approval received) and the derived columns — ``status``, ``approval_required``,
``approval_result``, ``approver`` — are recomputed from those facts whenever a row is written.
An event about an unknown call creates the row with what it says. Approvals: the first answer
(granted, denied or expired) that no ``security.rejected`` refused wins; later ones change
nothing.

A batch is applied in three steps: load the rows it touches (by call, grant and approval id),
fold its events into them in log order, then replace those rows (delete + insert by key). Plain
Core statements, identical on SQLite and PostgreSQL; since the fold depends only on the log,
a rebuild gives the same rows whatever the batch boundaries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Index,
    RowMapping,
    String,
    Table,
    Text,
    delete,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import Stored, Subjects
from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    Capability,
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
from nanocrab.projections.db import as_utc, bulk_insert, metadata

AuditStatus = Literal[
    "requested", "awaiting_approval", "granted", "denied", "running", "completed", "failed",
    "refused", "skipped", "revoked",
]  # fmt: skip
STATUSES: tuple[str, ...] = AuditStatus.__args__  # type: ignore[attr-defined]

ERROR_CHARS = 500
"""Tool error text kept per call (the full result stays in the log)."""
ARGUMENT_STRING_CHARS = 1000
"""Longer string arguments are cut (the JSON stays valid); the log keeps them whole."""

audit_invocations = Table(
    "audit_invocations",
    metadata,
    Column("call_id", String(128), primary_key=True),
    Column("trace_id", String(32)),
    Column("task_id", String(128)),
    Column("run_id", String(128)),
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
    Index("ix_audit_invocations_run", "run_id", "requested_at"),
    Index("ix_audit_invocations_time", "requested_at"),
    Index("ix_audit_invocations_grant", "grant_id"),
    Index("ix_audit_invocations_approval", "approval_id"),
)

audit_approvals = Table(
    "audit_approvals",
    metadata,
    Column("approval_id", String(128), primary_key=True),
    Column("run_id", String(128)),
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
    Column("grant_id", String(128), primary_key=True),
    Column("call_id", String(128)),
    Column("reason", Text, nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
)

_AUDITED = (
    ToolRequested, GrantIssued, GrantDenied, GrantRevoked, ToolStarted, ToolCompleted, ToolSkipped,
    ApprovalRequested, ApprovalGranted, ApprovalDenied, ApprovalExpired, SecurityRejected,
)  # fmt: skip

_ERROR_RANK = {"security": 0, "revoke": 1, "approval": 2, "grant": 3, "tool": 4}
"""Which explanation a call's ``error`` shows when several apply: the most decisive one."""


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex trace id of a W3C ``traceparent`` (``00-<trace>-<span>-<flags>``)."""
    parts = (traceparent or "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32:
        try:
            int(parts[1], 16)
        except ValueError:
            return None
        return parts[1].lower()
    return None


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > ARGUMENT_STRING_CHARS:
        return f"{value[:ARGUMENT_STRING_CHARS]}… (+{len(value) - ARGUMENT_STRING_CHARS} chars)"
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _caps(caps: Iterable[Capability]) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(c) for c in caps]


@dataclass(slots=True)
class _Call:
    """One ``audit_invocations`` row while a batch is folded (JSON columns decoded)."""

    call_id: str
    requested_at: datetime
    trace_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    session_id: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    requested_capabilities: list[dict[str, Any]] = field(default_factory=list)
    granted_capabilities: list[dict[str, Any]] = field(default_factory=list)
    tier: str | None = None
    rule: str | None = None
    grant_id: str | None = None
    grant_event_id: str | None = None
    approval_required: bool = False
    approval_id: str | None = None
    approval_result: str | None = None
    approver: str | None = None
    start_at: datetime | None = None
    end_at: datetime | None = None
    status: str = "requested"
    error: str | None = None
    error_source: str | None = None
    error_kind: str | None = None
    outcome: str | None = None
    grant_denied: bool = False
    remembered: bool = False
    revoked: bool = False

    def set_error(self, source: str, text: str) -> None:
        if self.error_source is None or _ERROR_RANK[source] >= _ERROR_RANK[self.error_source]:
            self.error, self.error_source = text, source

    def derive(self, approval: _Approval | None) -> None:
        """Recompute the derived columns from the facts (and the call's approval, if any)."""
        answer = approval.answer() if approval else None
        self.approval_required = bool(
            self.approval_id or self.remembered or self.tier in ("guarded", "unsafe")
        )
        status = approval.status if approval else None
        self.approval_result = "remembered" if self.remembered else status
        self.approver = answer.who() if answer and answer.kind != "expired" else None
        if answer and answer.kind in ("denied", "expired"):
            by = f" by {answer.approver}" if answer.approver else ""
            default = "approval expired" if answer.kind == "expired" else f"approval denied{by}"
            self.set_error("approval", answer.reason or default)
        elif self.error_source == "approval":
            self.error = self.error_source = None
        if self.error_source == "revoke" and self.outcome in ("completed", "skipped"):
            self.error = self.error_source = None  # revoked once done (run ended): not an error
        self.status = self._status(status)

    def _status(self, approval: str | None) -> str:
        if self.outcome:
            return self.outcome
        if self.revoked:
            return "revoked"
        if self.start_at:
            return "running"
        if self.grant_denied or approval in ("denied", "expired"):
            return "denied"
        if self.grant_id or approval == "granted":
            return "granted"
        if approval == "pending":
            return "awaiting_approval"
        return "requested"

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        out["arguments"] = None if self.arguments is None else _json(self.arguments)
        out["requested_capabilities"] = _json(self.requested_capabilities)
        out["granted_capabilities"] = _json(self.granted_capabilities)
        return out


class _Answer(msgspec.Struct, frozen=True):
    id: str
    kind: Literal["granted", "denied", "expired"]
    time: datetime
    approver: str | None = None
    signer: str | None = None
    remember: str | None = None
    reason: str | None = None

    def who(self) -> str | None:
        if not self.approver:
            return None
        return f"{self.approver} [{self.signer}]" if self.signer else self.approver


@dataclass(slots=True)
class _Approval:
    """One ``audit_approvals`` row while a batch is folded."""

    approval_id: str
    run_id: str | None = None
    session_id: str | None = None
    call_id: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    tier: str | None = None
    rule: str | None = None
    reason: str | None = None
    binding_hash: str | None = None
    options: list[str] = field(default_factory=list)
    requested_at: datetime | None = None
    expires_at: datetime | None = None
    status: str = "pending"
    approver: str | None = None
    signer: str | None = None
    remember: str | None = None
    answered_at: datetime | None = None
    answer_reason: str | None = None
    answers: list[_Answer] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    def answer(self) -> _Answer | None:
        """The answer that counts: the first one in log order that was neither refused nor
        given after the request expired (the policy denies those, as it says with an expiry)."""
        return next(
            (
                a
                for a in self.answers
                if a.id not in self.rejected
                and (a.kind == "expired" or self.expires_at is None or a.time <= self.expires_at)
            ),
            None,
        )

    def add(self, answer: _Answer) -> None:
        if all(a.id != answer.id for a in self.answers):
            self.answers.append(answer)

    def derive(self) -> None:
        a = self.answer()
        self.status = a.kind if a else "pending"
        self.approver = a.approver if a else None
        self.signer = a.signer if a else None
        self.remember = a.remember if a else None
        self.answered_at = a.time if a else None
        self.answer_reason = a.reason if a else None

    def row(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["arguments"] = None if self.arguments is None else _json(self.arguments)
        out["options"] = _json(self.options)
        out["answers"] = msgspec.json.encode(self.answers).decode()
        out["rejected"] = _json(self.rejected)
        return out


_answers = msgspec.json.Decoder(list[_Answer])


def _from_row(row: Any) -> dict[str, Any]:
    return {k: as_utc(v) if isinstance(v, datetime) else v for k, v in dict(row).items()}


def _load_call(row: Any) -> _Call:
    d = _from_row(row)
    for key in ("requested_capabilities", "granted_capabilities"):
        d[key] = json.loads(d[key])
    d["arguments"] = None if d["arguments"] is None else json.loads(d["arguments"])
    return _Call(**d)


def _load_approval(row: Any) -> _Approval:
    d = _from_row(row)
    d["arguments"] = None if d["arguments"] is None else json.loads(d["arguments"])
    d["options"] = json.loads(d["options"])
    d["answers"] = _answers.decode(d["answers"])
    d["rejected"] = json.loads(d["rejected"])
    return _Approval(**d)


_CHUNK = 500  # keys per IN (...): far below every backend's bound-parameter limit


def _chunks(keys: Iterable[str]) -> Iterable[list[str]]:
    keys = sorted(set(keys))
    for i in range(0, len(keys), _CHUNK):
        yield keys[i : i + _CHUNK]


async def _select_in(
    conn: AsyncConnection, table: Table, column: str, keys: Iterable[str]
) -> list[RowMapping]:
    rows: list[RowMapping] = []
    for chunk in _chunks(keys):
        result = await conn.execute(select(table).where(table.c[column].in_(chunk)))
        rows.extend(result.mappings().all())
    return rows


async def _replace(
    conn: AsyncConnection, table: Table, key: str, rows: Sequence[dict[str, Any]]
) -> None:
    for chunk in _chunks(r[key] for r in rows):
        await conn.execute(delete(table).where(table.c[key].in_(chunk)))
    await bulk_insert(conn, table, sorted(rows, key=lambda r: r[key]))


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
                if e.approval_id and (a := self.approvals.get(e.approval_id)) is not None:
                    if e.rejected_id not in a.rejected:
                        a.rejected.append(e.rejected_id)
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
    tables = (audit_invocations, audit_approvals, audit_violations, audit_revocations)
    lazy_checkpoint_s = 1.0
    gather_s = 0.1  # a run's calls land in a few transactions, not one per event

    @staticmethod
    def relevant(stored: Stored) -> bool:
        """Only tool, grant, approval and security events change the audit."""
        return isinstance(stored.event, _AUDITED)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.*.run.>"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        events = [s.event for s in batch if isinstance(s.event, _AUDITED)]
        fold = _Fold()
        await fold.load(conn, events)
        for e in events:
            fold.apply(e)
        await fold.write(conn)


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One tool call as the audit sees it (JSON columns decoded; times in UTC)."""

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

    @property
    def duration_ms(self) -> float | None:
        """From the (first) start to the completion; ``None`` unless both are known."""
        if self.start_at is None or self.end_at is None:
            return None
        return round((self.end_at - self.start_at).total_seconds() * 1000, 3)


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    """One approval request and the answer that counts (``status`` ``pending`` until one)."""

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


def _audit_row(row: Any) -> AuditRow:
    call = _load_call(row)
    return AuditRow(**{f.name: getattr(call, f.name) for f in fields(AuditRow)})


def _approval_row(row: Any) -> ApprovalRow:
    a = _load_approval(row)
    return ApprovalRow(**{f.name: getattr(a, f.name) for f in fields(ApprovalRow)})


async def audit_rows(
    engine: AsyncEngine,
    *,
    run_id: str | None = None,
    tool: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    limit: int = 1000,
) -> list[AuditRow]:
    """Tool calls matching every given filter (``since``: requested at or after), oldest first;
    the newest ``limit`` when more match."""
    t = audit_invocations
    query = select(t)
    if run_id is not None:
        query = query.where(t.c.run_id == run_id)
    if tool is not None:
        query = query.where(t.c.tool == tool)
    if status is not None:
        query = query.where(t.c.status == status)
    if since is not None:
        query = query.where(t.c.requested_at >= _utc(since))
    query = query.order_by(t.c.requested_at.desc(), t.c.call_id.desc()).limit(limit)
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
        .order_by(t.c.requested_at, t.c.approval_id)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [_approval_row(r) for r in rows]


async def approval_row(engine: AsyncEngine, approval_id: str) -> ApprovalRow | None:
    """The approval with this id, or the only one whose id starts with it; else ``None``."""
    if not approval_id:
        return None
    t = audit_approvals
    prefix = approval_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    async with engine.connect() as conn:
        exact = (await conn.execute(select(t).where(t.c.approval_id == approval_id))).mappings()
        if (row := exact.first()) is not None:
            return _approval_row(row)
        query = select(t).where(t.c.approval_id.like(f"{prefix}%", escape="\\")).limit(2)
        rows = (await conn.execute(query)).mappings().all()
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
    return [ViolationRow(**_from_row(r)) for r in rows]
