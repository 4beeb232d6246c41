"""One call and one approval while a batch is folded: facts in, derived columns out."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal

import msgspec
from sqlalchemy import (
    RowMapping,
    Table,
    delete,
    select,
    tuple_,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from nanocrab.events import (
    Capability,
)
from nanocrab.projections.audit.tables import (
    _ERROR_RANK,
    ARGUMENT_STRING_CHARS,
)
from nanocrab.projections.db import as_utc, bulk_insert


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


Key = tuple[str, str]
"""A row of a run: ``(run_id, id)`` — a call, an approval, a grant. Call ids come from the model
provider and repeat across runs (and the policy derives approval and grant ids from them), so
an id alone never names one row."""


@dataclass(slots=True)
class _Call:
    """One ``audit_invocations`` row while a batch is folded (JSON columns decoded)."""

    call_id: str
    run_id: str  # with call_id, the row's key (NO_RUN when the events name no run)
    requested_at: datetime
    trace_id: str | None = None
    task_id: str | None = None
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
    approval_run_id: str | None = None
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
    backend: str | None = None  # where it ran (tool.started.backend); None: locally
    settled_by: str | None = None  # executor / orchestrator: whose result ``outcome`` is
    guardrail_blocked: bool = False  # a tool_call verdict blocked it (guardrail.checked)

    @property
    def key(self) -> Key:
        return (self.run_id, self.call_id)

    @property
    def approval_key(self) -> Key | None:
        """The approval this call rests on, or ``None``."""
        if self.approval_id is None:
            return None
        return (self.approval_run_id or self.run_id, self.approval_id)

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
        # shallow: the nested values are encoded to JSON here (``asdict``, which deep-copied
        # them first, took ~7x as long per row)
        out = {name: getattr(self, name) for name in _CALL_COLUMNS}
        out["arguments"] = None if self.arguments is None else _json(self.arguments)
        out["requested_capabilities"] = _json(self.requested_capabilities)
        out["granted_capabilities"] = _json(self.granted_capabilities)
        return out


_CALL_COLUMNS = tuple(f.name for f in fields(_Call))


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
    run_id: str  # with approval_id, the row's key
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

    @property
    def key(self) -> Key:
        return (self.run_id, self.approval_id)

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
    conn: AsyncConnection, table: Table, column: str, values: Iterable[str]
) -> list[RowMapping]:
    rows: list[RowMapping] = []
    for chunk in _chunks(values):
        result = await conn.execute(select(table).where(table.c[column].in_(chunk)))
        rows.extend(result.mappings().all())
    return rows


async def _select_keys(
    conn: AsyncConnection, table: Table, column: str, keys: Iterable[Key], run: str = "run_id"
) -> list[RowMapping]:
    """The rows whose ``(run, column)`` is one of ``keys``.

    Selected by ``column`` alone (it leads an index, and an id rarely repeats), then narrowed to
    the keys' runs here."""
    wanted = set(keys)
    rows: list[RowMapping] = []
    for chunk in _chunks(k[1] for k in wanted):
        result = await conn.execute(select(table).where(table.c[column].in_(chunk)))
        rows.extend(r for r in result.mappings() if (r[run], r[column]) in wanted)
    return rows


async def _replace(
    conn: AsyncConnection, table: Table, key: tuple[str, ...], rows: Sequence[dict[str, Any]]
) -> None:
    """Delete the stored rows with the keys of ``rows`` (``key``: their key columns, the one
    that leads the primary key first), then insert ``rows``."""
    first = key[0]
    if len(key) == 1:
        for ids in _chunks(r[first] for r in rows):
            await conn.execute(delete(table).where(table.c[first].in_(ids)))
    else:
        columns = [table.c[k] for k in key]
        keys = sorted({tuple(r[k] for k in key) for r in rows})
        for i in range(0, len(keys), _CHUNK):
            chunk = keys[i : i + _CHUNK]
            # the leading column narrows through the key's index (SQLite scans the table for a
            # bare row-value IN)
            await conn.execute(
                delete(table)
                .where(columns[0].in_(sorted({k[0] for k in chunk})))
                .where(tuple_(*columns).in_(chunk))
            )
    await bulk_insert(conn, table, sorted(rows, key=lambda r: tuple(r[k] for k in key)))
