"""Bus failures are classified: a full log is permanent (ERROR, ``failure``, ``status``), a
passing outage transient."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import BusConfig, EventLog, HandlerRuntime, connect
from nanocrab.bus.errors import AppendRejected, BusError
from nanocrab.bus.failures import severity
from nanocrab.cli.status import gather_status
from nanocrab.events import TaskSubmitted, new_event_id
from nanocrab.handlers.echo import EchoReactor
from tests.conftest import eventually
from tests.test_runtime import FAST

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (nats.js.errors.ServiceUnavailableError(code=503), "transient"),
        (nats.errors.NoRespondersError(), "transient"),
        (nats.errors.TimeoutError(), "transient"),
        (nats.errors.ConnectionClosedError(), "transient"),
        (BusError("no acknowledgement within 5s"), "transient"),
        (nats.js.errors.NotFoundError(code=404, err_code=10014), "transient"),  # re-created
        (nats.js.errors.NotFoundError(code=404, err_code=10059), "permanent"),
        (nats.js.errors.ServerError(code=500, err_code=10023), "permanent"),
        (nats.js.errors.BadRequestError(code=400, err_code=10012), "permanent"),
        (AppendRejected("full", code=503, err_code=10077), "permanent"),
        (AppendRejected("no responders"), "transient"),
    ],
)
def test_severity(exc: BaseException, expected: str) -> None:
    assert severity(exc) == expected


@pytest.fixture
async def small_log(nats_url: str, tmp_path: Path) -> AsyncIterator[EventLog]:
    """A log that holds a few kilobytes and refuses new events when full (discard-new)."""
    cfg = BusConfig(
        url=nats_url, data_dir=tmp_path, root=f"full{new_event_id()[-8:].lower()}",
        max_event_bytes=2048, max_msg_bytes=2048, log_max_bytes=6000,
    )  # fmt: skip
    nc = await connect(nats_url, name="full-log-test")
    yield await EventLog.open(nc, cfg)
    with contextlib.suppress(nats.errors.Error):
        await nc.drain()


async def fill(log: EventLog) -> AppendRejected:
    """Append tasks until the log refuses one; the refusal."""
    for i in range(100):
        try:
            await log.append(TaskSubmitted(text=f"task {i} " + "x" * 400, run_id=new_event_id()))
        except AppendRejected as exc:
            return exc
    raise AssertionError("the log never filled up")


async def test_a_full_log_is_a_permanent_failure_shown_by_status(
    small_log: EventLog, sqlite_engine: AsyncEngine
) -> None:
    refused = await fill(small_log)
    assert severity(refused) == "permanent", (refused.code, refused.err_code)
    out = await gather_status(small_log, sqlite_engine)
    (entry,) = [s for s in out["streams"] if s["name"] == small_log.cfg.log_stream]
    assert entry["full"] is True
    assert any(small_log.cfg.log_stream in p and "full" in p for p in out["problems"])


async def test_a_handler_on_a_full_log_logs_an_error_and_keeps_it(
    small_log: EventLog, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(small_log)
    runtime = HandlerRuntime(small_log, EchoReactor(), options=FAST)
    task = asyncio.create_task(runtime.run())
    try:
        failure = await eventually(lambda: runtime.failure, timeout=20)
        assert "AppendRejected" in failure
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and "echo" in r.message]
        assert errors, "a permanent failure is logged at ERROR"
    finally:
        runtime.stop()
        await asyncio.wait_for(task, 20)


async def test_a_healthy_log_shows_no_problems(log: EventLog, sqlite_engine: AsyncEngine) -> None:
    out = await gather_status(log, sqlite_engine)
    assert out["problems"] == []
    assert not any(s["full"] for s in out["streams"])
