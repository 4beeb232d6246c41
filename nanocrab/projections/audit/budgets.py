"""Runs stopped by a spending cap: one ``audit_budgets`` row per ``budget.exceeded``, with what
became of it — ``failed`` (the cap ends runs), ``asked`` (a person is asked for more), then
``raised`` (``budget.raised``: who approved, by how much) or ``refused`` (``budget.refused``:
denied, expired, nobody to ask)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, DateTime, Float, Index, Integer, String, Table, Text, select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.events import BudgetExceeded, BudgetRaised, BudgetRefused
from nanocrab.projections.db import as_utc, metadata

audit_budgets = Table(
    "audit_budgets",
    metadata,
    Column("id", String(64), primary_key=True),  # the budget.exceeded event's id
    Column("time", DateTime(timezone=True), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("run_id", String(128)),
    Column("session_id", String(128)),
    Column("scope", String(16), nullable=False),  # run, session, agent, tenant
    Column("key", String(128), nullable=False),  # which run, session, agent or tenant
    Column("limit_kind", String(8), nullable=False),  # usd, tokens
    Column("spent_usd", Float, nullable=False),
    Column("spent_tokens", Integer, nullable=False),
    Column("max_usd", Float),
    Column("max_tokens", Integer),
    Column("turn", Integer, nullable=False),
    Column("source", String(128), nullable=False),  # the orchestrator that decided
    Column("on_exceed", String(8), nullable=False),  # fail, ask
    Column("status", String(16), nullable=False),  # failed, asked, raised, refused
    Column("raise_usd", Float),  # ask: what an approval adds
    Column("raise_tokens", Integer),
    Column("approval_id", String(128)),
    Column("approver", String(200)),  # raised: who approved; refused: who denied, or null
    Column("answered_at", DateTime(timezone=True)),
    Column("answer", String(16)),  # raised, denied, expired, no_approver
    Column("answer_reason", Text),
    Index("ix_audit_budgets_time", "time"),
    Index("ix_audit_budgets_run", "run_id"),
)


def budget_row(e: BudgetExceeded) -> dict[str, Any]:
    inc = e.increment
    return {
        "id": e.id, "time": e.time, "tenant": e.tenant, "run_id": e.run_id,
        "session_id": e.session_id, "scope": e.scope, "key": e.key, "limit_kind": e.limit,
        "spent_usd": e.spent_usd, "spent_tokens": e.spent_tokens, "max_usd": e.max_usd,
        "max_tokens": e.max_tokens, "turn": e.turn, "source": e.source,
        "on_exceed": e.on_exceed, "status": "asked" if e.on_exceed == "ask" else "failed",
        "raise_usd": inc.max_usd if inc else None, "raise_tokens": inc.max_tokens if inc else None,
        "approval_id": None, "approver": None, "answered_at": None, "answer": None,
        "answer_reason": None,
    }  # fmt: skip


def budget_answer(row: dict[str, Any], e: BudgetRaised | BudgetRefused) -> None:
    """Fold a person's answer (the first stands) into the row of the stop it answers."""
    if row.get("answer") is not None:
        return
    row["approval_id"], row["answered_at"] = e.approval_id, e.time
    if isinstance(e, BudgetRaised):
        row.update(status="raised", answer="raised", approver=e.approver or None)
    else:
        row.update(status="refused", answer=e.answer, answer_reason=e.reason or None)


@dataclass(frozen=True, slots=True)
class BudgetRow:
    id: str
    time: datetime
    tenant: str
    run_id: str | None
    session_id: str | None
    scope: str
    key: str
    limit_kind: str
    spent_usd: float
    spent_tokens: int
    max_usd: float | None
    max_tokens: int | None
    turn: int
    source: str
    on_exceed: str = "fail"
    status: str = "failed"
    raise_usd: float | None = None
    raise_tokens: int | None = None
    approval_id: str | None = None
    approver: str | None = None
    answered_at: datetime | None = None
    answer: str | None = None
    answer_reason: str | None = None


async def budget_stops(
    engine: AsyncEngine, *, run_id: str | None = None, since: datetime | None = None
) -> list[BudgetRow]:
    """Runs a spending cap stopped (``budget.exceeded``), oldest first."""
    t = audit_budgets
    query = select(t)
    if run_id is not None:
        query = query.where(t.c.run_id == run_id)
    if since is not None:
        query = query.where(t.c.time >= as_utc(since).astimezone(UTC))
    async with engine.connect() as conn:
        rows = (await conn.execute(query.order_by(t.c.time, t.c.id))).mappings().all()
    return [
        BudgetRow(**{**r, "time": as_utc(r["time"]),
                     "answered_at": as_utc(r["answered_at"]) if r["answered_at"] else None})
        for r in rows
    ]  # fmt: skip
