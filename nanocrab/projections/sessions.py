"""Sessions: the user/assistant messages of each session, so a new task sees what came before.

A session spans many runs. Its messages are the task texts, the replies, and steer / follow-up
messages of its top-level runs (a subagent's run is a session of its own). ``/new`` archives a
session: its history no longer feeds new tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    String,
    Table,
    Text,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import Stored, Subjects
from nanocrab.events import MessageQueued, ReplySent, SessionArchived, TaskSubmitted
from nanocrab.projections.db import bulk_insert, checkpoints, metadata

session_messages = Table(
    "session_messages",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("session_id", String(128), nullable=False),
    Column("run_id", String(128), nullable=False),
    Column("role", String(16), nullable=False),
    Column("text", Text, nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Index("ix_session_messages_session", "session_id", "seq"),
)

archived_sessions = Table(
    "archived_sessions",
    metadata,
    Column("session_id", String(128), primary_key=True),
    Column("archived", Boolean, nullable=False),
    Column("next_session_id", String(128)),
    Column("time", DateTime(timezone=True), nullable=False),
)


class SessionsProjection:
    name = "sessions"
    tables = (session_messages, archived_sessions)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.>"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        rows, archives = [], []
        for s in batch:
            e = s.event
            if e is None or not e.session_id or not e.run_id:
                continue
            match e:
                case TaskSubmitted(text=text) if not e.parent_run_id and not text.startswith("/"):
                    role = "user"
                case MessageQueued(text=text):
                    role = "user"
                case ReplySent(text=text):
                    role = "assistant"
                case SessionArchived():
                    archives.append({
                        "session_id": e.session_id, "archived": True,
                        "next_session_id": e.next_session_id, "time": e.time,
                    })  # fmt: skip
                    continue
                case _:
                    continue
            rows.append({
                "seq": s.seq, "event_id": e.id, "session_id": e.session_id, "run_id": e.run_id,
                "role": role, "text": text, "time": e.time,
            })  # fmt: skip
        # a second copy of an event adds nothing; a session is archived once (the first wins)
        await bulk_insert(conn, session_messages, rows, unless_exists="event_id")
        await bulk_insert(conn, archived_sessions, archives, unless_exists="session_id")


async def session_history(
    engine: AsyncEngine,
    session_id: str,
    exclude_run_id: str,
    *,
    before_seq: int = 0,
    wait_s: float = 5.0,
    limit: int = 200,
) -> list[tuple[str, str]]:
    """The session's earlier ``(role, text)`` messages (newest ``limit``, oldest first); empty
    when the session was archived.

    Waits (up to ``wait_s``) until the projection has applied everything before ``before_seq``,
    so a task that follows a reply at once still sees that reply.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while before_seq > 1:
        async with engine.connect() as conn:
            position = await conn.scalar(
                select(checkpoints.c.stream_seq).where(
                    checkpoints.c.name == SessionsProjection.name
                )
            )
        if (position or 0) >= before_seq - 1 or loop.time() > deadline:
            break
        await asyncio.sleep(0.005)
    async with engine.connect() as conn:
        archived = await conn.scalar(
            select(archived_sessions.c.archived).where(archived_sessions.c.session_id == session_id)
        )
        if archived:
            return []
        result = await conn.execute(
            select(session_messages.c.role, session_messages.c.text)
            .where(session_messages.c.session_id == session_id)
            .where(session_messages.c.run_id != exclude_run_id)
            .order_by(session_messages.c.seq.desc())
            .limit(limit)
        )
        return [(str(role), str(text)) for role, text in reversed(result.all())]
