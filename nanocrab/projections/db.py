"""Engines and the tables shared by every projection: checkpoints and failures; inserting
rows once per event id."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    event,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from nanocrab.bus import Stored

metadata = MetaData()

StreamSeq = BigInteger().with_variant(Integer(), "sqlite")
"""The type of a table's ``seq`` primary key (a stream sequence). On SQLite it is declared
``INTEGER``, which makes the key the table's own rowid: one B-tree fewer to write per row (a
``BIGINT`` key is a separate unique index beside the rowid). Same 64-bit values elsewhere.
Tables created before keep their ``BIGINT`` key and work as they did (the columns are the same,
so nothing is rebuilt for it); ``nanocrab projections rebuild`` gives them the faster one."""

checkpoints = Table(
    "projection_checkpoints",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("stream_seq", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

failures = Table(
    "projection_failures",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("position", BigInteger, nullable=False),  # the checkpoint it could not move past
    Column("error", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
"""The last failure of each projection that could not apply a batch. It is current while the
projection's checkpoint is still at ``position``; once the checkpoint moves on it is history."""


def _sqlite_datetime(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is not None and value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    # SQLAlchemy's storage format for DateTime on SQLite ("%Y-%m-%d %H:%M:%S.%f", naive), so
    # rows read back through ``Table`` as usual; %-formatting writes it in 3/4 of isoformat's
    # time (which asks the zone for its offset), half an f-string's and 2/5 of strftime's
    v = value
    return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031 (see above)
        v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond,
    )  # fmt: skip


async def bulk_insert(
    conn: AsyncConnection,
    table: Table,
    rows: Sequence[dict[str, Any]],
    *,
    unless_exists: str | None = None,
) -> None:
    """Insert ``rows`` (dicts with the same keys) with one ``executemany``.

    ``unless_exists`` names a unique column: a row whose value there is already stored, or
    came earlier in ``rows``, is skipped (the first one stays). That is how a projection keyed by
    event id ignores a second copy of an event.

    On SQLite this hands values straight to the driver: SQLAlchemy's per-row bind processing was
    half of a rebuild's time. Datetimes are stored as UTC in SQLAlchemy's own SQLite format, so
    reads through the table are unchanged (naive; see :func:`as_utc`). Other databases take the
    regular Core path.
    """
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        stmt = postgresql.insert(table)
        if unless_exists is not None:
            stmt = stmt.on_conflict_do_nothing(index_elements=[unless_exists])
        await conn.execute(stmt, list(rows))
        return
    if conn.dialect.name != "sqlite":
        if unless_exists is not None:
            rows = await _not_stored(conn, table, unless_exists, rows)
        if rows:
            await conn.execute(insert(table), list(rows))
        return
    cols = list(rows[0])
    getter = itemgetter(*cols)
    dt_cols = [i for i, c in enumerate(cols) if isinstance(table.c[c].type, DateTime)]
    params: list[Any] = [getter(r) for r in rows]
    if dt_cols:
        converted = []
        for p in params:
            values = list(p)
            for i in dt_cols:
                values[i] = _sqlite_datetime(values[i])
            converted.append(tuple(values))
        params = converted
    sql = f'INSERT INTO "{table.name}" ({", ".join(cols)}) VALUES ({", ".join("?" for _ in cols)})'
    if unless_exists is not None:
        sql += f' ON CONFLICT ("{unless_exists}") DO NOTHING'
    await conn.exec_driver_sql(sql, params)


async def _not_stored(
    conn: AsyncConnection, table: Table, key: str, rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``rows`` without those whose ``key`` is stored already or repeats an earlier row's."""
    seen = set(await _stored_keys(conn, table, key, {r[key] for r in rows}))
    out = []
    for r in rows:
        if r[key] not in seen:
            seen.add(r[key])
            out.append(r)
    return out


_KEYS_PER_QUERY = 500  # far below every backend's bound-parameter limit


async def _stored_keys(
    conn: AsyncConnection, table: Table, key: str, values: set[Any]
) -> list[Any]:
    found: list[Any] = []
    ordered = sorted(values)
    for i in range(0, len(ordered), _KEYS_PER_QUERY):
        chunk = ordered[i : i + _KEYS_PER_QUERY]
        found += (await conn.execute(select(table.c[key]).where(table.c[key].in_(chunk)))).scalars()
    return found


def applied_events(projection: str) -> Table:
    """A table of the ids of the events ``projection`` has applied, with their sequence.

    For projections that fold events into state (rather than store one row per event): with
    :func:`first_copies` it makes a second copy of an event (the log can hold two, see
    docs/events.md, Guarantees) change nothing, whatever came in between.
    """
    return Table(
        f"{projection}_applied_events",
        metadata,
        Column("event_id", String(64), primary_key=True),
        Column("seq", BigInteger, nullable=False),
    )


async def first_copies(
    conn: AsyncConnection, applied: Table, batch: Sequence[Stored]
) -> list[Stored]:
    """The events of ``batch`` whose id ``applied`` (see :func:`applied_events`) has not seen,
    each id once, in log order; their ids are recorded in the same transaction. Messages that
    did not decode are left out."""
    decoded = [(s, s.event.id) for s in batch if s.event is not None]
    if not decoded:
        return []
    seen = set(await _stored_keys(conn, applied, "event_id", {eid for _, eid in decoded}))
    out: list[Stored] = []
    rows: list[dict[str, Any]] = []
    for s, eid in decoded:
        if eid not in seen:
            seen.add(eid)
            out.append(s)
            rows.append({"event_id": eid, "seq": s.seq})
    await bulk_insert(conn, applied, rows)
    return out


def as_utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes (stored as UTC); PostgreSQL returns aware ones."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def default_url(data_dir: Path) -> str:
    """SQLite in the data directory: the single-machine default."""
    return f"sqlite+aiosqlite:///{Path(data_dir).resolve() / 'projections.db'}"


WAL_PAGES = 256
"""Pages (4 KiB) of SQLite write-ahead log after which a commit checkpoints it (see make_engine)."""


def make_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for any SQLAlchemy URL; SQLite gets WAL so readers never block the writer.

    The WAL is bounded (:data:`WAL_PAGES`): SQLite's default lets it grow to 1,000 pages and
    keeps the file at its largest size after every checkpoint, 4 MB on disk that was more than
    the read models themselves for the first thousand tasks (bench/agent_latency.py). A
    checkpoint every ``WAL_PAGES`` pages (the projection worker's, off the handlers' loop), and
    the file truncated back to that size when a checkpoint resets it."""
    engine = create_async_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        if url.startswith("sqlite+aiosqlite:///") and not url.endswith(":memory:"):
            Path(url.removeprefix("sqlite+aiosqlite:///")).parent.mkdir(parents=True, exist_ok=True)

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=5000")
            cur.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
            cur.execute(f"PRAGMA journal_size_limit={WAL_PAGES * 4096}")
            cur.close()

    return engine
