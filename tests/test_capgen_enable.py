"""A generated capability waits, disabled, for the user (seed 001); ``generate --enable`` is
the user saying yes up front."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog
from nanocrab.cli.capgen import _follow
from nanocrab.cli.host import Host
from nanocrab.events import CapabilityRequested
from nanocrab.handlers.capgen import CapgenHandler
from nanocrab.projections import capability
from nanocrab.sandbox import Sandbox
from tests.test_capgen import FAST, WORD_COUNT_V1, block, project, provider
from tests.test_capgen import sandbox as sandbox  # the session fixture

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("enable", "status"), [(False, "disabled"), (True, "enabled")])
async def test_generate_enables_only_when_asked(
    log: EventLog, sqlite_engine: AsyncEngine, sandbox: Sandbox, enable: bool, status: str
) -> None:
    handler = CapgenHandler(
        log, provider=provider({"count": [block(WORD_COUNT_V1)]}), sandbox=sandbox
    )
    host = Host(log, sqlite_engine, [handler], projections=[], options=FAST)
    await host.start()
    try:
        request = CapabilityRequested(name="", guidance="count words", max_attempts=1)
        assert await _follow(log, request, 90, True, enable=enable) == 0
    finally:
        await host.stop(drain_s=5)
    await project(log, sqlite_engine)
    detail = await capability(sqlite_engine, "word_count")
    assert detail is not None and detail.row.status == status
