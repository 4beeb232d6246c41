"""Dead letters: messages a handler could not process, with the reason and where the bytes are."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import BigInteger, Column, DateTime, Integer, String, Table, Text, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import Stored, Subjects
from nanocrab.events import BusDeadLettered, BusMalformed
from nanocrab.projections.db import StreamSeq, bulk_insert, metadata

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("seq", StreamSeq, primary_key=True, autoincrement=False),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("handler", String(128), nullable=False),
    Column("stream", String(128), nullable=False),
    Column("stream_seq", BigInteger, nullable=False),
    Column("subject", String(512), nullable=False),
    Column("reason_kind", String(32), nullable=False),
    Column("reason", Text, nullable=False),
    Column("deliveries", Integer, nullable=False),
    Column("preview", Text, nullable=False),
)


class DeadLettersProjection:
    name = "dead_letters"
    tables = (dead_letters,)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.*.system.*.bus.*"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        rows = [
            {
                "seq": s.seq,
                "event_id": e.id,
                "time": e.time,
                "handler": e.handler,
                "stream": e.stream,
                "stream_seq": e.stream_seq,
                "subject": e.subject,
                "reason_kind": e.reason_kind,
                "reason": e.reason,
                "deliveries": e.deliveries,
                "preview": e.preview,
            }
            for s in batch
            if isinstance(e := s.event, BusMalformed | BusDeadLettered)
        ]
        # a record's id is derived from (handler, stream position): a second copy adds nothing
        await bulk_insert(conn, dead_letters, rows, unless_exists="event_id")


async def list_dead_letters(engine: AsyncEngine, limit: int = 100) -> list[dict[str, object]]:
    async with engine.connect() as conn:
        result = await conn.execute(
            select(dead_letters).order_by(dead_letters.c.seq.desc()).limit(limit)
        )
        return [dict(r) for r in result.mappings().all()]
