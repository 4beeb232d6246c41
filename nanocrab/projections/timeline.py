"""Run timeline: every event of every run, with what it was, who emitted it and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Column, DateTime, Index, String, Table, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import Stored, Subjects
from nanocrab.events import (
    AlertRaised,
    ApprovalDenied,
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
    HookApplied,
    LlmFailed,
    LlmResponded,
    MemoryConsolidated,
    MemoryRecalled,
    PlanCreated,
    PlanStepCompleted,
    PlanStepFailed,
    PlanStepStarted,
    ReplySent,
    RouteDecided,
    RunCompleted,
    RunFailed,
    RunStarted,
    SecurityRejected,
    TaskSubmitted,
    ToolCompleted,
    ToolRequested,
)
from nanocrab.projections.db import StreamSeq, as_utc, bulk_insert, metadata

run_timeline = Table(
    "run_timeline",
    metadata,
    Column("seq", StreamSeq, primary_key=True, autoincrement=False),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("run_id", String(128), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("type", String(64), nullable=False),
    Column("source", String(128), nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("causation_id", String(64)),
    Column("step_id", String(128)),
    Column("summary", String(300), nullable=False, default=""),
    Index("ix_run_timeline_run", "run_id", "seq"),
)


def summarize(event: Event, limit: int = 300) -> str:
    """One readable line for a timeline row."""
    match event:
        case TaskSubmitted(text=t) | ReplySent(text=t):
            text = t
        case RunStarted(agent=agent, config=config):
            # the configuration version the run is pinned to (docs/reload.md)
            text = f"agent {agent}, config {config[:12] or 'startup'}"
        case RunCompleted(reply=r):
            text = r
        case RunFailed(kind=k, reason=r):
            text = f"{k}: {r}"
        case LlmResponded(model=m, usage=u, stop_reason=s):
            text = f"{m} {s} in={u.input_tokens} out={u.output_tokens}"
        case LlmFailed(kind=k, message=m, failover_to=target):
            # a move to the agent's next model (llm/failover.py) names both
            text = f"{k}: {m}" + (f" → failover from {event.model} to {target}" if target else "")
        case ToolRequested(tool=tool, arguments=args):
            shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
            text = f"{tool}({shown})"
        case GrantIssued(tool=tool, capabilities=caps, tier=tier, rule=rule):
            text = f"{tool} {tier} by {rule or '-'} on {', '.join(c.resource or '*' for c in caps)}"
        case GrantDenied(tool=tool, reason=reason):
            text = f"{tool}: {reason}"
        case ApprovalRequested(tool=tool, tier=tier, approval_id=aid):
            text = f"{tool} {tier}: waiting for an approver ({aid})"
        case ApprovalGranted(approver=who, remember=remember):
            text = f"by {who} ({remember})"
        case ApprovalDenied(approver=who, reason=reason):
            text = f"by {who}: {reason}"
        case GrantRevoked(grant_id=gid, reason=reason):
            text = f"{gid}: {reason}"
        case SecurityRejected(rejected_type=kind, reason=reason):
            text = f"{kind}: {reason}"
        case ToolCompleted(tool=tool, is_error=e, duration_ms=d):
            text = f"{tool} {'error' if e else 'ok'} {d:.0f}ms"
        case GuardrailChecked():
            text = _verdict(event)
        case AlertRaised(severity=severity, summary=summary):
            text = f"{severity}: {summary}"
        case MemoryRecalled(item_ids=ids, scores=scores):
            # the sources a run's prompt was given, best first
            text = ", ".join(f"{i} {s:.2f}" for i, s in zip(ids, scores, strict=False))
        case RouteDecided(agent=agent, method=method, score=score, margin=margin):
            text = f"{agent} by {method} (score {score:.2f}, margin {margin:.2f})"
        case MemoryConsolidated(episode_id=eid, summary=summary):
            text = f"{eid}: {summary}"
        case BudgetExceeded(scope=scope, key=key, spent_usd=usd, spent_tokens=tokens):
            text = f"{scope} {key}: spent ${usd:.4f}, {tokens} tokens"
            if event.on_exceed == "ask":
                text += "; asking for more"
        case BudgetRaised(scope=scope, key=key, increment=inc, approver=who):
            more = " and ".join(x for x in (
                f"${inc.max_usd}" if inc.max_usd is not None else "",
                f"{inc.max_tokens} tokens" if inc.max_tokens is not None else "",
            ) if x)  # fmt: skip
            text = f"{scope} {key}: +{more} approved by {who or '-'}"
        case BudgetRefused(answer=answer, reason=reason):
            text = f"{answer}: {reason}"
        case PlanCreated(steps=steps, revision=rev):
            text = f"revision {rev}: " + "; ".join(
                f"{i + 1}. {st.intent}" for i, st in enumerate(steps)
            )
        case PlanStepStarted(index=i, step=st):
            text = f"step {i + 1}: {st.intent} [{', '.join(st.tools) or 'no tools'}]"
        case PlanStepCompleted(index=i, summary=summary):
            text = f"step {i + 1} done: {summary}"
        case PlanStepFailed(index=i, reason=reason, replan=replan):
            text = f"step {i + 1} failed: {reason}" + ("; re-planning" if replan else "")
        case HookApplied(hook=hook, point=point, summary=summary, note=note, error=error):
            # an extension hook's effect (nanocrab/hooks): which, where, how
            what = f"error: {error}" if error else "; ".join(x for x in (summary, note) if x)
            text = f"{hook} at {point}: {what}"
        case _:
            text = ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _verdict(v: GuardrailChecked) -> str:
    what = f"{v.checkpoint} {v.action}" + (f" {v.tool}" if v.tool else "")
    if v.fired:
        labels = sorted({f.label for f in v.findings})
        what += f" by {','.join(v.fired)} ({','.join(labels)})"
    if v.redactions:
        what += f", {v.redactions} redacted"
    if v.error:
        what += f", detector error: {v.error}"
    return f"{what}: {v.reason}" if v.reason else what


class RunTimelineProjection:
    name = "run_timeline"
    tables = (run_timeline,)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.*.run.>"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        rows = [
            {
                "seq": s.seq,
                "event_id": s.event.id,
                "run_id": s.event.run_id or "-",
                "tenant": s.event.tenant,
                "type": s.event.type,
                "source": s.event.source,
                "time": s.event.time,
                "causation_id": s.event.causation_id,
                "step_id": s.event.step_id,
                "summary": summarize(s.event),
            }
            for s in batch
            if s.event is not None
        ]
        # a second copy of an event (a re-send after the duplicate window) adds nothing
        await bulk_insert(conn, run_timeline, rows, unless_exists="event_id")


@dataclass(frozen=True, slots=True)
class TimelineRow:
    seq: int
    time: datetime
    type: str
    source: str
    causation_id: str | None
    step_id: str | None
    summary: str
    since_previous_ms: float | None


async def run_timeline_rows(engine: AsyncEngine, run_id: str) -> list[TimelineRow]:
    """The projected timeline of one run, with the time elapsed since the previous event."""
    async with engine.connect() as conn:
        result = await conn.execute(
            select(run_timeline).where(run_timeline.c.run_id == run_id).order_by(run_timeline.c.seq)
        )
        rows = result.mappings().all()
    out: list[TimelineRow] = []
    previous: datetime | None = None
    for r in rows:
        t = as_utc(r["time"])
        delta = None if previous is None else (t - previous).total_seconds() * 1000
        previous = t
        out.append(
            TimelineRow(
                r["seq"],
                t,
                r["type"],
                r["source"],
                r["causation_id"],
                r["step_id"],
                r["summary"],
                delta,
            )
        )
    return out
