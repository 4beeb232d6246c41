"""What a projection is: tables, a subject filter, and an ``apply`` run inside a transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from nanocrab.bus import Stored, Subjects


class ProjectionError(Exception):
    """Root of every error raised by ``nanocrab.projections``."""


class ProjectionFailed(ProjectionError):
    """A projection could not apply the events after its checkpoint ``position``: nothing of
    the batch was kept, the checkpoint did not move. ``reason`` is the underlying error (the
    exception is chained); the failure is also recorded in ``projection_failures``."""

    def __init__(self, name: str, position: int, reason: str, *, attempts: int = 1) -> None:
        super().__init__(
            f"projection {name} cannot apply the events after seq {position}: {reason}"
        )
        self.name = name
        self.position = position
        self.reason = reason
        self.attempts = attempts  # consecutive failures at this position, in this process


class Projection(Protocol):
    """A read model built from the log.

    ``apply`` receives events in log order that were never applied before (the projector skips
    anything at or below the stored checkpoint) and runs in the same transaction that advances
    the checkpoint, so it must not commit. Undecodable messages arrive with ``event=None``.

    ``apply`` must be idempotent on event id: the log can hold a second copy of an event (a
    re-send after the duplicate window; docs/events.md, Guarantees), at a later sequence, and
    that copy must change nothing — however many events came in between, in this batch or an
    earlier one. Projections keyed by event id insert with ``bulk_insert(...,
    unless_exists="event_id")``; those that fold events into state filter their batch through
    ``first_copies`` (``projections/db.py``).
    """

    name: str

    @property
    def tables(self) -> Sequence[Table]:
        """The projection's own tables (a class attribute in implementations)."""
        ...

    def subject_filter(self, subjects: Subjects) -> str: ...

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None: ...


class SparseProjection(Projection, Protocol):
    """A projection whose filter delivers many events it ignores (the audit reads every run
    event for a handful of types). A batch with nothing ``relevant`` costs no transaction: the
    projector only remembers the position, writing the checkpoint with the next relevant batch,
    at most every ``lazy_checkpoint_s`` while idle, and on stop. Re-reading ignored events after
    a crash is harmless. Nobody may wait on such a projection's checkpoint per event. Live, it
    also ``gather_s`` events into one transaction instead of one per event (its rows lag the log
    by that much)."""

    lazy_checkpoint_s: float
    gather_s: float

    def relevant(self, stored: Stored) -> bool: ...
