"""Runs stopped by a spending cap: one ``audit_budgets`` row per ``budget.exceeded``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, DateTime, Float, Index, Integer, String, Table, select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.events import BudgetExceeded
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
    Index("ix_audit_budgets_time", "time"),
    Index("ix_audit_budgets_run", "run_id"),
)


def budget_row(e: BudgetExceeded) -> dict[str, Any]:
    return {
        "id": e.id, "time": e.time, "tenant": e.tenant, "run_id": e.run_id,
        "session_id": e.session_id, "scope": e.scope, "key": e.key, "limit_kind": e.limit,
        "spent_usd": e.spent_usd, "spent_tokens": e.spent_tokens, "max_usd": e.max_usd,
        "max_tokens": e.max_tokens, "turn": e.turn, "source": e.source,
    }  # fmt: skip


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
    return [BudgetRow(**{**r, "time": as_utc(r["time"])}) for r in rows]
