"""SQL read models rebuilt from the log (SQLAlchemy 2 async; SQLite or PostgreSQL)."""

import logging

from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog
from nanocrab.projections.audit import (
    ApprovalRow,
    AuditProjection,
    AuditRow,
    ViolationRow,
    approval_row,
    audit_rows,
    pending_approvals,
    violations,
)
from nanocrab.projections.base import Projection, ProjectionError, ProjectionFailed
from nanocrab.projections.capabilities import (
    CapabilitiesProjection,
    CapabilityDetail,
    CapabilityRow,
    CapabilityStats,
    VersionRow,
    capability,
    capability_stats,
    list_capabilities,
)
from nanocrab.projections.db import checkpoints, default_url, failures, make_engine, metadata
from nanocrab.projections.deadletters import (
    DeadLettersProjection,
    dead_letters,
    list_dead_letters,
)
from nanocrab.projections.guardrails import (
    GuardrailsProjection,
    guardrail_alert_rows,
    guardrail_verdict_rows,
)
from nanocrab.projections.memory import MemoryProjection
from nanocrab.projections.memory_search import Recalled, recall
from nanocrab.projections.projector import Projector
from nanocrab.projections.sessions import SessionsProjection, session_history
from nanocrab.projections.spec import BusSpec, reopenable
from nanocrab.projections.timeline import (
    RunTimelineProjection,
    TimelineRow,
    run_timeline,
    run_timeline_rows,
    summarize,
)
from nanocrab.projections.usage import UsageProjection
from nanocrab.projections.worker import ProjectionWorker


def all_projections() -> list[Projection]:
    """Every read model this version ships, in rebuild order."""
    return [
        RunTimelineProjection(), DeadLettersProjection(), SessionsProjection(), AuditProjection(),
        CapabilitiesProjection(), GuardrailsProjection(), MemoryProjection(), UsageProjection(),
    ]  # fmt: skip


async def catch_up_projection(log: EventLog, engine: AsyncEngine, name: str) -> int:
    """Bring one projection (by name) up to the end of the log before reading it: create its
    tables if missing, apply what it lacks, return how many events were applied.

    For commands that read a projection when no ``nanocrab up`` may be keeping it current. If
    another process writes the same projection at the same moment (a ``nanocrab up``), the clash
    is logged and 0 returned: that process is bringing it up to date anyway.
    """
    projection = next((p for p in all_projections() if p.name == name), None)
    if projection is None:
        known = ", ".join(p.name for p in all_projections())
        raise ProjectionError(f"no projection named {name!r}; known: {known}")
    projector = Projector(log, engine, projection)
    try:
        await projector.setup()
        return await projector.catch_up()
    except ProjectionFailed as exc:
        if not isinstance(exc.__cause__, OperationalError | IntegrityError):
            raise
        clash = exc.reason
    except OperationalError as exc:
        clash = str(exc.orig)
    logging.getLogger(__name__).warning(
        "projection %s not brought up to date (another writer?): %s", name, clash
    )
    return 0


__all__ = [
    "ApprovalRow",
    "AuditProjection",
    "AuditRow",
    "BusSpec",
    "CapabilitiesProjection",
    "CapabilityDetail",
    "CapabilityRow",
    "CapabilityStats",
    "DeadLettersProjection",
    "GuardrailsProjection",
    "MemoryProjection",
    "Projection",
    "ProjectionError",
    "ProjectionFailed",
    "ProjectionWorker",
    "Projector",
    "Recalled",
    "RunTimelineProjection",
    "SessionsProjection",
    "TimelineRow",
    "UsageProjection",
    "VersionRow",
    "ViolationRow",
    "all_projections",
    "approval_row",
    "audit_rows",
    "capability",
    "capability_stats",
    "catch_up_projection",
    "checkpoints",
    "dead_letters",
    "default_url",
    "failures",
    "guardrail_alert_rows",
    "guardrail_verdict_rows",
    "list_capabilities",
    "list_dead_letters",
    "make_engine",
    "metadata",
    "pending_approvals",
    "recall",
    "reopenable",
    "run_timeline",
    "run_timeline_rows",
    "session_history",
    "summarize",
    "violations",
]  # fmt: skip
