"""Engines and the checkpoint table shared by every projection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Column, DateTime, MetaData, String, Table, event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

metadata = MetaData()

checkpoints = Table(
    "projection_checkpoints",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("stream_seq", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)


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
