"""What a projection is: tables, a subject filter, and an ``apply`` run inside a transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from nanocrab.bus import Stored, Subjects


class ProjectionError(Exception):
    """Root of every error raised by ``nanocrab.projections``."""


class Projection(Protocol):
    """A read model built from the log.

    ``apply`` receives events in log order that were never applied before (the projector skips
    anything at or below the stored checkpoint) and runs in the same transaction that advances
    the checkpoint, so it must not commit. Undecodable messages arrive with ``event=None``.
    """

    name: str
    tables: Sequence[Table]

    def subject_filter(self, subjects: Subjects) -> str: ...

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None: ...
