"""SQL read models rebuilt from the log (SQLAlchemy 2 async; SQLite or PostgreSQL)."""

from nanocrab.projections.base import Projection, ProjectionError
from nanocrab.projections.db import checkpoints, default_url, make_engine, metadata
from nanocrab.projections.deadletters import (
    DeadLettersProjection,
    dead_letters,
    list_dead_letters,
)
from nanocrab.projections.projector import Projector
from nanocrab.projections.sessions import SessionsProjection, session_history
from nanocrab.projections.timeline import (
    RunTimelineProjection,
    TimelineRow,
    run_timeline,
    run_timeline_rows,
    summarize,
)


def all_projections() -> list[Projection]:
    """Every read model this version ships, in rebuild order."""
    return [RunTimelineProjection(), DeadLettersProjection(), SessionsProjection()]


__all__ = [
    "DeadLettersProjection",
    "Projection",
    "ProjectionError",
    "Projector",
    "RunTimelineProjection",
    "SessionsProjection",
    "TimelineRow",
    "all_projections",
    "checkpoints",
    "dead_letters",
    "default_url",
    "list_dead_letters",
    "make_engine",
    "metadata",
    "run_timeline",
    "run_timeline_rows",
    "session_history",
    "summarize",
]  # fmt: skip
