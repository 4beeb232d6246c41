"""Background loops are supervised and rebuild their memory from the log: a crash restarts them,
and a restarted process still expires approvals and times out runs an earlier process left."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import agents
from nanocrab.bus import Delivery, EventLog, Reaction
from nanocrab.cli.host import Host
from nanocrab.events import Event, GrantDenied, LlmRequested, RunFailed, TaskSubmitted
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.projections import AuditProjection
from tests.agent_fixtures import FAST, submit
from tests.conftest import eventually
from tests.security_rig import security_rig
from tests.test_security import pending_write, rules

pytestmark = pytest.mark.timeout(60)


class Crashy:
    """A reactor whose background loop crashes ``crashes`` times, then counts its ticks."""

    name = "crashy"
    consumes: tuple[type[Event], ...] = (TaskSubmitted,)

    def __init__(self, crashes: int) -> None:
        self.crashes = crashes
        self.entered = 0
        self.ticks = 0

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event] | Reaction:
        return []

    async def background(self) -> None:
        self.entered += 1
        if self.entered <= self.crashes:
            raise RuntimeError(f"crash {self.entered}")
        while True:
            self.ticks += 1
            await asyncio.sleep(0.01)


async def test_host_restarts_a_crashed_background_loop(
    log: EventLog, sqlite_engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    reactor = Crashy(crashes=2)
    host = Host(log, sqlite_engine, [reactor], projections=[], options=FAST)
    await host.start()
    try:
        await eventually(lambda: reactor.ticks > 0, timeout=20)
        (item,) = host.supervised
        assert item.name == "crashy" and item.restarts == 2
        assert item.last_error == "RuntimeError('crash 2')"
        crashes = [r for r in caplog.records if "background crashy crashed" in r.getMessage()]
        assert len(crashes) == 2 and all(r.exc_info for r in crashes), "logged with traceback"
    finally:
        await host.stop(drain_s=2)


async def test_the_approval_expiry_survives_a_crash_of_its_loop(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    async with security_rig(log, sqlite_engine, tmp_path, rules(tmp_path, timeout=0.5)) as rig:
        assert rig.handler is not None
        original = rig.handler._expire_due
        failures = 0

        async def flaky(now: Any = None) -> None:
            nonlocal failures
            if failures == 0:
                failures += 1
                raise ConnectionError("the bus went away")
            await original(now)

        rig.handler._expire_due = flaky  # type: ignore[method-assign]
        run, call = await pending_write(rig)
        await rig.approval(run, call)
        outcome = await rig.outcome(run, call)
        assert isinstance(outcome, GrantDenied) and "in time" in outcome.reason
        assert failures == 1
        assert rig.host is not None
        assert [s.restarts for s in rig.host.supervised if s.name == "policy"] == [1]


async def test_an_approval_requested_while_the_policy_was_down_expires_after_restart(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    # the first process asks for the approval but never gets round to expiring it
    async with security_rig(log, sqlite_engine, tmp_path, rules(tmp_path, timeout=1)) as rig:
        assert rig.handler is not None
        rig.handler.watch_interval_s = 3600
        run, call = await pending_write(rig)
        request = await rig.approval(run, call)
    assert not [e for e in await rig.events(run) if isinstance(e, GrantDenied)]
    # the next process learns of it from the log alone, and expires it when it is due
    async with security_rig(log, sqlite_engine, tmp_path, rules(tmp_path, timeout=1)) as rig:
        assert rig.handler is not None
        await rig.handler.recovered.wait()
        assert request.approval_id in rig.handler.open, "the approval was replayed from the log"
        outcome = await rig.outcome(run, call)
        assert isinstance(outcome, GrantDenied) and "in time" in outcome.reason


async def test_an_approval_stored_after_the_replay_is_followed(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    async with security_rig(log, sqlite_engine, tmp_path, rules(tmp_path, timeout=0.5)) as rig:
        assert rig.handler is not None
        await rig.handler.recovered.wait()
        run, call = await pending_write(rig)
        request = await rig.approval(run, call)
        outcome = await rig.outcome(run, call)
        assert isinstance(outcome, GrantDenied) and "in time" in outcome.reason
        assert request.approval_id not in rig.handler.open


async def test_a_run_stuck_before_a_restart_is_timed_out_by_the_next_process(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = agents.DEFAULT.model_copy(update={"name": "stuck", "timeout_s": 3600.0})
    monkeypatch.setitem(agents.PROFILES, "stuck", slow)
    task = submit("nobody will answer", tmp_path, agent="stuck")
    # no LLM handler: the run waits for a model that never answers
    host = Host(log, sqlite_engine, [Orchestrator(log, watchdog_interval_s=0.05)],
                projections=[], options=FAST)  # fmt: skip
    await host.start()
    try:
        await log.append(task)

        async def requested() -> bool:
            return any(isinstance(e, LlmRequested) for e in await _events(log, task.run_id))

        await eventually(requested)
    finally:
        await host.stop(drain_s=2)

    monkeypatch.setitem(agents.PROFILES, "stuck", slow.model_copy(update={"timeout_s": 0.01}))
    restarted = Orchestrator(log, watchdog_interval_s=0.05)
    host = Host(log, sqlite_engine, [restarted], projections=[AuditProjection()], options=FAST)
    await host.start()
    try:

        async def failed() -> RunFailed | None:
            return next(
                (e for e in await _events(log, task.run_id) if isinstance(e, RunFailed)), None
            )

        outcome = await eventually(failed, timeout=20)
        assert outcome.kind == "timeout"
        # the orchestrator stops watching once it hears its own run.failed
        await eventually(lambda: task.run_id not in restarted.deadlines)
    finally:
        await host.stop(drain_s=2)


async def _events(log: EventLog, run_id: str | None) -> list[Event]:
    from nanocrab.bus import read_run

    assert run_id is not None
    return [s.event for s in await read_run(log, run_id) if s.event is not None]
