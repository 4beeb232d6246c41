"""Sessions: the user/assistant messages of each session, so a new task sees what came before.

A session spans many runs. Its messages are the task texts, the replies, and steer / follow-up
messages of its top-level runs (a subagent's run is a session of its own). ``/new`` archives a
session: its history no longer feeds new tasks. A session is a tenant's: another tenant's session
of the same id is another session (ids are chosen by whoever submits a task). The first
``task_input`` verdict on a message decides what history keeps of it (``judged``), as in the
run's own state.
"""

from __future__ import annotations

import sqlite3
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Index,
    String,
    Table,
    Text,
    and_,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import Stored, Subjects
from nanocrab.events import (
    GuardrailChecked,
    MessageQueued,
    ReplySent,
    SessionArchived,
    TaskSubmitted,
    screened_message,
)
from nanocrab.projections.db import StreamSeq, bulk_insert, checkpoints, metadata

session_messages = Table(
    "session_messages",
    metadata,
    Column("seq", StreamSeq, primary_key=True, autoincrement=False),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("tenant", String(128), nullable=False),
    Column("session_id", String(128), nullable=False),
    Column("run_id", String(128), nullable=False),
    Column("role", String(16), nullable=False),
    Column("text", Text, nullable=False),
    Column("judged", Boolean, nullable=False),  # a task_input verdict on it was folded
    Column("time", DateTime(timezone=True), nullable=False),
    Index("ix_session_messages_session", "session_id", "tenant", "seq"),
)

archived_sessions = Table(
    "archived_sessions",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("session_id", String(128), primary_key=True),
    Column("archived", Boolean, nullable=False),
    Column("next_session_id", String(128)),
    Column("time", DateTime(timezone=True), nullable=False),
)


_SESSION_EVENTS = (TaskSubmitted, MessageQueued, ReplySent, SessionArchived, GuardrailChecked)


class SessionsProjection:
    """A sparse projection (``projections/base.py``): most of the log is other events, which
    cost no transaction, and live events are gathered into a few. Nobody waits on its
    checkpoint: the LLM handler folds the same events from the log itself."""

    name = "sessions"
    tables = (session_messages, archived_sessions)
    lazy_checkpoint_s = 1.0
    gather_s = 0.1

    @staticmethod
    def relevant(stored: Stored) -> bool:
        return isinstance(stored.event, _SESSION_EVENTS)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.>"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        rows: list[dict[str, Any]] = []
        archives: list[dict[str, Any]] = []
        verdicts: dict[str, GuardrailChecked] = {}
        for s in batch:
            e = s.event
            if e is None or not e.session_id or not e.run_id:
                continue
            match e:
                case GuardrailChecked(checkpoint="task_input"):
                    verdicts.setdefault(e.target_id, e)
                    continue
                case TaskSubmitted(text=text) if not e.parent_run_id and not text.startswith("/"):
                    role = "user"
                case MessageQueued(text=text):
                    role = "user"
                case ReplySent(text=text):
                    role = "assistant"
                case SessionArchived():
                    archives.append({
                        "tenant": e.tenant, "session_id": e.session_id, "archived": True,
                        "next_session_id": e.next_session_id, "time": e.time,
                    })  # fmt: skip
                    continue
                case _:
                    continue
            rows.append({
                "seq": s.seq, "event_id": e.id, "tenant": e.tenant, "session_id": e.session_id,
                "run_id": e.run_id, "role": role, "text": text, "judged": False, "time": e.time,
            })  # fmt: skip
        # a second copy of an event adds nothing; a session is archived once (the first wins)
        await bulk_insert(conn, session_messages, rows, unless_exists="event_id")
        ar = archived_sessions.c
        for archive in archives:  # rare (``/new``): one at a time, the first one stays
            held = select(ar.archived).where(
                ar.tenant == archive["tenant"], ar.session_id == archive["session_id"]
            )
            if await conn.scalar(held) is None:
                await conn.execute(insert(archived_sessions).values(**archive))
        # the first task_input verdict on a message: history keeps what it left (a redaction,
        # a note for a block); later ones change nothing
        m = session_messages.c
        if not verdicts:
            return
        ids = list(verdicts)
        for i in range(0, len(ids), 500):  # far below every backend's bound-parameter limit
            unjudged = select(m.event_id, m.text).where(
                m.event_id.in_(ids[i : i + 500]), m.judged.is_(False)
            )
            for event_id, text in (await conn.execute(unjudged)).all():
                left = screened_message(verdicts[event_id], text)
                values = {"judged": True} if left is None else {"judged": True, "text": left}
                await conn.execute(
                    update(session_messages).where(m.event_id == event_id).values(**values)
                )


async def session_history(
    engine: AsyncEngine,
    session_id: str,
    exclude_run_id: str,
    *,
    tenant: str = "default",
    limit: int = 200,
) -> list[tuple[str, str]]:
    """The session's ``(role, text)`` messages as the projection holds them now (newest
    ``limit``, oldest first), leaving out run ``exclude_run_id``; empty when it was archived.

    A read model lags the log: the LLM handler takes a task's history from the log instead
    (``handlers/sessions.py``), which asks :func:`session_snapshot` for a session once.
    """
    async with engine.connect() as conn:
        ar = archived_sessions.c
        archived = await conn.scalar(
            select(ar.archived).where(ar.session_id == session_id, ar.tenant == tenant)
        )
        if archived:
            return []
        result = await conn.execute(
            select(session_messages.c.role, session_messages.c.text)
            .where(session_messages.c.session_id == session_id)
            .where(session_messages.c.tenant == tenant)
            .where(session_messages.c.run_id != exclude_run_id)
            .order_by(session_messages.c.seq.desc())
            .limit(limit)
        )
        return [(str(role), str(text)) for role, text in reversed(result.all())]


class SessionRow(NamedTuple):
    seq: int
    event_id: str
    run_id: str
    role: str
    text: str
    judged: bool


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """One session as the projection held it at stream sequence ``position``: its newest rows
    up to there (oldest first) and whether it was archived (by then or since: the archive has
    no sequence). ``position`` 0: the projection has nothing yet (or no tables at all)."""

    position: int
    archived: bool
    rows: tuple[SessionRow, ...]


async def session_snapshot(
    engine: AsyncEngine, session_id: str, *, up_to: int, limit: int, tenant: str = "default"
) -> SessionSnapshot:
    """``tenant``'s session's rows at the projection's checkpoint or ``up_to``, whichever is
    lower.

    One statement, so one consistent view: the checkpoint commits with every row at or below
    it. What lies between the checkpoint and ``up_to`` is for the caller to read from the log.

    On a SQLite file the statement runs on a plain read-only ``sqlite3`` connection, on the
    caller's thread: an indexed lookup of one session takes tens of microseconds, while the
    async path's thread hops (pool, execute, fetch, release), each waiting for a turn of a busy
    event loop, took milliseconds — the first model call of every new session waited on them.
    A WAL reader never waits for the writer; any error (no file or tables yet, a busy moment)
    falls back to the async path.
    """
    found_sync = _sync_snapshot(engine, session_id, tenant, up_to=up_to, limit=limit)
    if found_sync is not None:
        return _snapshot(found_sync, up_to)
    cp, ar, m = checkpoints.c, archived_sessions.c, session_messages.c
    query = (
        select(cp.stream_seq, ar.archived, m.seq, m.event_id, m.run_id, m.role, m.text, m.judged)
        .select_from(
            checkpoints.outerjoin(
                archived_sessions, and_(ar.session_id == session_id, ar.tenant == tenant)
            ).outerjoin(
                session_messages,
                and_(
                    m.session_id == session_id,
                    m.tenant == tenant,
                    m.seq <= cp.stream_seq,
                    m.seq <= up_to,
                ),
            )
        )
        .where(cp.name == SessionsProjection.name)
        .order_by(m.seq.desc())
        .limit(limit)
    )
    async with engine.connect() as conn:
        try:
            found = (await conn.execute(query)).all()
        except DBAPIError:
            await conn.rollback()
            if await conn.run_sync(_has_tables):
                raise
            found = []  # no projector has set the sessions projection up here yet
    return _snapshot(found, up_to)


def _snapshot(found: Sequence[Sequence[object]], up_to: int) -> SessionSnapshot:
    if not found:
        return SessionSnapshot(0, False, ())
    rows = tuple(SessionRow(int(str(r[2])), str(r[3]), str(r[4]), str(r[5]), str(r[6]),
                            bool(r[7]))
                 for r in reversed(found) if r[2] is not None)  # fmt: skip
    return SessionSnapshot(min(int(str(found[0][0])), up_to), bool(found[0][1]), rows)


_SNAPSHOT_SQL = (
    "SELECT cp.stream_seq, ar.archived, m.seq, m.event_id, m.run_id, m.role, m.text, m.judged "
    f"FROM {checkpoints.name} AS cp "
    f"LEFT OUTER JOIN {archived_sessions.name} AS ar "
    "ON ar.session_id = :sid AND ar.tenant = :tenant "
    f"LEFT OUTER JOIN {session_messages.name} AS m ON m.session_id = :sid "
    "AND m.tenant = :tenant AND m.seq <= cp.stream_seq AND m.seq <= :up_to "
    "WHERE cp.name = :name ORDER BY m.seq DESC LIMIT :lim"
)  # the query of session_snapshot, for a plain sqlite3 connection

_readers: weakref.WeakKeyDictionary[AsyncEngine, sqlite3.Connection] = weakref.WeakKeyDictionary()


def _sync_snapshot(
    engine: AsyncEngine, session_id: str, tenant: str, *, up_to: int, limit: int
) -> list[tuple[object, ...]] | None:
    """The snapshot's rows read on this thread, or ``None`` to take the async path."""
    conn = _readers.get(engine)
    if conn is None:
        conn = _open_reader(engine)
        if conn is None:
            return None
        _readers[engine] = conn
    params = {
        "sid": session_id, "tenant": tenant, "up_to": up_to, "name": SessionsProjection.name,
        "lim": limit,
    }  # fmt: skip
    try:
        found: list[tuple[object, ...]] = conn.execute(_SNAPSHOT_SQL, params).fetchall()
    except sqlite3.Error:
        return None  # no tables yet, a busy moment: the async path decides
    return found


def _open_reader(engine: AsyncEngine) -> sqlite3.Connection | None:
    """A read-only connection to the engine's SQLite file, ``None`` for anything else."""
    url = engine.url
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    path = Path(url.database)
    if not path.is_file():
        return None  # not created yet: asked again next time
    try:
        return sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, timeout=0.05
        )
    except sqlite3.Error:
        return None


def _has_tables(conn: Connection) -> bool:
    names = set(inspect(conn).get_table_names())
    return all(t.name in names for t in (checkpoints, session_messages, archived_sessions))
