"""Fixtures: a real nats-server from the wheel, a fresh subject root per test, real databases."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import BusConfig, EmbeddedServer, EventLog, HandlerRuntime, connect
from nanocrab.bus.server import free_port
from nanocrab.projections import make_engine

PG_HOST, PG_PORT = "127.0.0.1", 5432


@contextlib.asynccontextmanager
async def running(runtime: HandlerRuntime) -> AsyncIterator[HandlerRuntime]:
    """``runtime`` running in a task; stopped (and waited for) on exit."""
    task = asyncio.create_task(runtime.run())
    try:
        yield runtime
    finally:
        runtime.stop()
        await asyncio.wait_for(task, 10)


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedServer(tmp_path_factory.mktemp("nats"), port=free_port())
    url = server.start()
    assert server.owned, "the test server must be ours, not a reused one"
    yield url
    server.stop()


@pytest.fixture
def cfg(nats_url: str, tmp_path: Path) -> BusConfig:
    """A unique root (and so unique streams) per test: tests share one server, not state."""
    return BusConfig(url=nats_url, data_dir=tmp_path, root=f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def log(cfg: BusConfig) -> AsyncIterator[EventLog]:
    assert cfg.url
    nc = await connect(cfg.url, name="test")
    yield await EventLog.open(nc, cfg)
    with contextlib.suppress(Exception):
        await nc.drain()


def postgres_reachable() -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((PG_HOST, PG_PORT)) == 0


@pytest.fixture(params=["sqlite", "postgres"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """The projection contract runs on every backend: SQLite always, PostgreSQL when reachable."""
    if request.param == "sqlite":
        eng = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'projections.db'}")
        yield eng
        await eng.dispose()
        return
    if not postgres_reachable():
        pytest.skip(f"PostgreSQL not reachable on {PG_HOST}:{PG_PORT}")
    import asyncpg

    db = f"nanocrab_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(host=PG_HOST, port=PG_PORT, user="postgres", database="postgres")
    await admin.execute(f'CREATE DATABASE "{db}"')
    eng = make_engine(f"postgresql+asyncpg://postgres@{PG_HOST}:{PG_PORT}/{db}")
    try:
        yield eng
    finally:
        await eng.dispose()
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def sqlite_engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """One SQLite projections database (for tests that are not the projection contract)."""
    eng = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'projections.db'}")
    yield eng
    await eng.dispose()


async def eventually(predicate, timeout: float = 30.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll a predicate (a plain or an async callable) until it returns a truthy value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)


@pytest.fixture(autouse=True)
def _agent_profiles_restored() -> Iterator[None]:
    """The start-up agent profiles are process state (agents.yaml, MCP tools added to the
    default): what a test installs must not reach the next test of the same worker."""
    from nanocrab import agents

    saved, extra = dict(agents.PROFILES), list(agents._extra_tools)
    yield
    agents.PROFILES.clear()
    agents.PROFILES.update(saved)
    agents._extra_tools[:] = extra
    agents._tables.clear()
