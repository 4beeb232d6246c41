"""Engines and the checkpoint table shared by every projection."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Column, DateTime, MetaData, String, Table, event, insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

metadata = MetaData()

checkpoints = Table(
    "projection_checkpoints",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("stream_seq", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)


def _sqlite_datetime(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.strftime(_SQLITE_DATETIME)


# SQLAlchemy's storage format for DateTime on SQLite, so rows read back through ``Table`` as usual.
_SQLITE_DATETIME = "%Y-%m-%d %H:%M:%S.%f"


async def bulk_insert(conn: AsyncConnection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert ``rows`` (dicts with the same keys) with one ``executemany``.

    On SQLite this hands values straight to the driver: SQLAlchemy's per-row bind processing was
    half of a rebuild's time. Datetimes are stored as UTC in SQLAlchemy's own SQLite format, so
    reads through the table are unchanged (naive; see :func:`as_utc`). Other databases take the
    regular Core path.
    """
    if not rows:
        return
    if conn.dialect.name != "sqlite":
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
    await conn.exec_driver_sql(sql, params)


def as_utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes (stored as UTC); PostgreSQL returns aware ones."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def default_url(data_dir: Path) -> str:
    """SQLite in the data directory: the single-machine default."""
    return f"sqlite+aiosqlite:///{Path(data_dir).resolve() / 'projections.db'}"


def make_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for any SQLAlchemy URL; SQLite gets WAL so readers never block the writer."""
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
            cur.close()

    return engine
