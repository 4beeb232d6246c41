"""Usage: every model call with its tokens, cost and latency, attributable to a run, session,
agent, tenant and day; and the spending view the orchestrator's shared budget caps read.

Rows come from ``llm.responded`` (one per call; cost as the LLM handler priced it with
``nanocrab/llm/pricing.py``) and ``run.started`` (the agent a run runs as, joined at read time).
Both are keyed by event id, so a second copy of an event adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import (
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Table,
    func,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import Stored, Subjects
from nanocrab.events import LlmResponded, RunStarted
from nanocrab.projections.db import StreamSeq, as_utc, bulk_insert, metadata

usage_calls = Table(
    "usage_calls",
    metadata,
    Column("seq", StreamSeq, primary_key=True, autoincrement=False),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("run_id", String(128), nullable=False),
    Column("session_id", String(128)),
    Column("provider", String(64), nullable=False),
    Column("model", String(128), nullable=False),
    Column("input_tokens", Integer, nullable=False),
    Column("output_tokens", Integer, nullable=False),
    Column("cache_read_tokens", Integer, nullable=False),
    Column("cache_write_tokens", Integer, nullable=False),
    Column("cost_usd", Float, nullable=False),
    Column("latency_ms", Float, nullable=False),
    Index("ix_usage_calls_run", "run_id"),
    Index("ix_usage_calls_session", "session_id"),
    Index("ix_usage_calls_tenant_time", "tenant", "time"),
)

usage_runs = Table(
    "usage_runs",
    metadata,
    Column("seq", StreamSeq, primary_key=True, autoincrement=False),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("run_id", String(128), nullable=False),
    Column("agent", String(128), nullable=False),
    Index("ix_usage_runs_run", "run_id"),
    Index("ix_usage_runs_agent", "agent"),
)


class UsageProjection:
    """``usage_calls`` (one row per model call) and ``usage_runs`` (each run's agent)."""

    name = "usage"
    tables = (usage_calls, usage_runs)
    lazy_checkpoint_s = 1.0
    gather_s = 0.1
    commit_interval_s = 0.1  # shared budget caps read it (docs/observability.md): short lag

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.*.run.>"

    @staticmethod
    def relevant(stored: Stored) -> bool:
        return isinstance(stored.event, LlmResponded | RunStarted)

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        calls: list[dict[str, object]] = []
        runs: list[dict[str, object]] = []
        for s in batch:
            e = s.event
            if isinstance(e, LlmResponded):
                u = e.usage
                calls.append({
                    "seq": s.seq, "event_id": e.id, "time": e.time, "tenant": e.tenant,
                    "run_id": e.run_id or "-", "session_id": e.session_id,
                    "provider": e.provider, "model": e.model,
                    "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                    "cache_read_tokens": u.cache_read_tokens,
                    "cache_write_tokens": u.cache_write_tokens,
                    "cost_usd": e.cost_usd, "latency_ms": e.latency_ms,
                })  # fmt: skip
            elif isinstance(e, RunStarted):
                runs.append(
                    {"seq": s.seq, "event_id": e.id, "run_id": e.run_id or "-", "agent": e.agent}
                )
        await bulk_insert(conn, usage_calls, calls, unless_exists="event_id")
        await bulk_insert(conn, usage_runs, runs, unless_exists="event_id")


GroupBy = Literal["run", "session", "agent", "tenant", "day", "model"]


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Model calls of one group: ``key`` is the run, session, agent, tenant, day or model."""

    key: str
    calls: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float
    latency_ms: float  # mean latency of a call

    @property
    def tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + (self.cache_write_tokens)
        )


async def usage_rows(
    engine: AsyncEngine,
    by: GroupBy = "run",
    *,
    since: datetime | None = None,
    tenant: str | None = None,
    limit: int = 1000,
) -> list[UsageRow]:
    """Usage per group, costliest first; ``since``: calls at or after that time only."""
    c, r = usage_calls.c, usage_runs.c
    keys = {
        "run": c.run_id,
        "session": func.coalesce(c.session_id, "-"),
        "agent": func.coalesce(r.agent, "-"),
        "tenant": c.tenant,
        "day": func.substr(func.cast(c.time, String), 1, 10),
        "model": c.model,
    }
    key = keys[by].label("key")
    stmt = (
        select(
            key,
            func.count().label("calls"),
            func.sum(c.input_tokens),
            func.sum(c.output_tokens),
            func.sum(c.cache_read_tokens),
            func.sum(c.cache_write_tokens),
            func.sum(c.cost_usd),
            func.avg(c.latency_ms),
        )
        .select_from(usage_calls.outerjoin(usage_runs, r.run_id == c.run_id))
        .group_by(key)
        .order_by(func.sum(c.cost_usd).desc(), key)
        .limit(limit)
    )
    if since is not None:
        stmt = stmt.where(c.time >= as_utc(since))
    if tenant is not None:
        stmt = stmt.where(c.tenant == tenant)
    async with engine.connect() as conn:
        rows = (await conn.execute(stmt)).all()
    return [
        UsageRow(
            str(k),
            int(n),
            int(i or 0),
            int(o or 0),
            int(cr or 0),
            int(cw or 0),
            float(usd or 0.0),
            float(ms or 0.0),
        )
        for k, n, i, o, cr, cw, usd, ms in rows
    ]


@dataclass(frozen=True, slots=True)
class Totals:
    """Dollars and tokens (input + output + cache read + cache write) of some model calls."""

    usd: float = 0.0
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class OtherRuns:
    """What the other runs of one run's session, agent and tenant spent, as projected so far."""

    session: Totals
    agent: Totals
    tenant: Totals


async def other_runs(
    engine: AsyncEngine, *, run_id: str, session_id: str | None, agent: str, tenant: str
) -> OtherRuns:
    """The spending the orchestrator's shared budget caps compare against (``run_id``
    excluded: its own spending is folded from its events, exactly)."""
    c, r = usage_calls.c, usage_runs.c
    tokens = c.input_tokens + c.output_tokens + c.cache_read_tokens + c.cache_write_tokens
    cols = (func.coalesce(func.sum(c.cost_usd), 0.0), func.coalesce(func.sum(tokens), 0))
    others = c.run_id != run_id
    async with engine.connect() as conn:
        t = (await conn.execute(select(*cols).where(others, c.tenant == tenant))).one()
        joined = usage_calls.join(usage_runs, r.run_id == c.run_id)
        stmt = select(*cols).select_from(joined).where(others, r.agent == agent)
        a = (await conn.execute(stmt)).one()
        s = Totals()
        if session_id is not None:
            stmt = select(*cols).where(others, c.session_id == session_id)
            row = (await conn.execute(stmt)).one()
            s = Totals(float(row[0]), int(row[1]))
    return OtherRuns(
        session=s, agent=Totals(float(a[0]), int(a[1])), tenant=Totals(float(t[0]), int(t[1]))
    )
