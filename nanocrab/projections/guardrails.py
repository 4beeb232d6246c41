"""Guardrail verdicts and alerts: one row per ``guardrail.checked`` and per ``alert.raised``.

What ``nanocrab guardrails verdicts`` lists. Rows carry what the events carry — filter ids,
labels, spans' count, the reason — never a checked text (``redacted_text`` stays in the log).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Column, DateTime, Float, Index, Integer, String, Table, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import Stored, Subjects
from nanocrab.events import AlertRaised, GuardrailChecked
from nanocrab.projections.db import StreamSeq, as_utc, bulk_insert, metadata

guardrail_verdicts = Table(
    "guardrail_verdicts",
    metadata,
    Column("seq", StreamSeq, primary_key=True, autoincrement=False),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("run_id", String(128), nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("checkpoint", String(16), nullable=False),
    Column("target_id", String(128), nullable=False),
    Column("tool", String(128)),
    Column("action", String(24), nullable=False),
    Column("fired", String(300), nullable=False, default=""),
    Column("labels", String(300), nullable=False, default=""),
    Column("findings", Integer, nullable=False, default=0),
    Column("redactions", Integer, nullable=False, default=0),
    Column("alerts", Integer, nullable=False, default=0),
    Column("reason", String(300), nullable=False, default=""),
    Column("error", String(300)),
    Column("duration_ms", Float, nullable=False, default=0.0),
    Index("ix_guardrail_verdicts_run", "run_id", "seq"),
)

guardrail_alerts = Table(
    "guardrail_alerts",
    metadata,
    Column("seq", StreamSeq, primary_key=True, autoincrement=False),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("run_id", String(128), nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("filter_id", String(128), nullable=False, default=""),
    Column("checkpoint", String(16)),
    Column("action", String(24)),
    Column("summary", String(300), nullable=False, default=""),
    Column("verdict_event_id", String(64)),
    Index("ix_guardrail_alerts_run", "run_id", "seq"),
)


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class GuardrailsProjection:
    name = "guardrails"
    tables = (guardrail_verdicts, guardrail_alerts)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.*.run.>"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        verdicts: list[dict[str, object]] = []
        alerts: list[dict[str, object]] = []
        for s in batch:
            match s.event:
                case GuardrailChecked() as v:
                    verdicts.append({
                        "seq": s.seq, "event_id": v.id, "run_id": v.run_id or "-",
                        "time": v.time, "checkpoint": v.checkpoint, "target_id": v.target_id,
                        "tool": v.tool, "action": v.action, "fired": _clip(",".join(v.fired)),
                        "labels": _clip(",".join(sorted({f.label for f in v.findings}))),
                        "findings": len(v.findings), "redactions": v.redactions,
                        "alerts": len(v.alerts), "reason": _clip(v.reason),
                        "error": _clip(v.error) if v.error else None,
                        "duration_ms": v.duration_ms,
                    })  # fmt: skip
                case AlertRaised() as a:
                    alerts.append({
                        "seq": s.seq, "event_id": a.id, "run_id": a.run_id or "-",
                        "time": a.time, "severity": a.severity, "filter_id": a.filter_id,
                        "checkpoint": a.checkpoint, "action": a.action,
                        "summary": _clip(a.summary), "verdict_event_id": a.verdict_event_id,
                    })  # fmt: skip
        if verdicts:
            await bulk_insert(conn, guardrail_verdicts, verdicts, unless_exists="event_id")
        if alerts:
            await bulk_insert(conn, guardrail_alerts, alerts, unless_exists="event_id")


@dataclass(frozen=True, slots=True)
class VerdictRow:
    seq: int
    event_id: str
    run_id: str
    time: datetime
    checkpoint: str
    target_id: str
    tool: str | None
    action: str
    fired: str
    labels: str
    findings: int
    redactions: int
    alerts: int
    reason: str
    error: str | None
    duration_ms: float


@dataclass(frozen=True, slots=True)
class AlertRow:
    seq: int
    event_id: str
    run_id: str
    time: datetime
    severity: str
    filter_id: str
    checkpoint: str | None
    action: str | None
    summary: str
    verdict_event_id: str | None


async def guardrail_verdict_rows(
    engine: AsyncEngine, *, run_id: str | None = None, limit: int = 200
) -> list[VerdictRow]:
    """Verdicts, newest last (``run_id``: that run's only; else the latest ``limit``)."""
    query = select(guardrail_verdicts).order_by(guardrail_verdicts.c.seq.desc()).limit(limit)
    if run_id is not None:
        query = query.where(guardrail_verdicts.c.run_id == run_id)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [VerdictRow(**{**r, "time": as_utc(r["time"])}) for r in reversed(rows)]


async def guardrail_alert_rows(
    engine: AsyncEngine, *, run_id: str | None = None, limit: int = 200
) -> list[AlertRow]:
    """Alerts, newest last (``run_id``: that run's only; else the latest ``limit``)."""
    query = select(guardrail_alerts).order_by(guardrail_alerts.c.seq.desc()).limit(limit)
    if run_id is not None:
        query = query.where(guardrail_alerts.c.run_id == run_id)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [AlertRow(**{**r, "time": as_utc(r["time"])}) for r in reversed(rows)]
