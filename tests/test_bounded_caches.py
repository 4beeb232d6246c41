"""Every in-memory cache of a long-lived process is bounded (issue 10, bug 7): caches evict and
re-read the log, per-run bookkeeping ends with the run. ``bench/soak.py`` measures the RSS."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog
from nanocrab.events import RunStarted, TaskSubmitted, new_event_id
from nanocrab.handlers import policy as policy_module
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.handlers.policy import PolicyHandler
from nanocrab.handlers.runloader import CAPACITY, RunLoader
from nanocrab.llm import ScriptedProvider
from nanocrab.security import KeyRing
from tests.agent_fixtures import OPEN_POLICY, agent_reactors, finished, running_host, submit
from tests.conftest import eventually

pytestmark = pytest.mark.timeout(60)

ONE_TOOL = """
scripts:
  - name: one-tool
    turns:
      - tool_calls: [{name: read, input: {path: notes.txt}}]
      - text: "done"
"""


async def test_the_run_loader_evicts_and_reloads_from_the_log(log: EventLog) -> None:
    assert CAPACITY <= 512, "a cache of run states, not a second log"
    runs = [new_event_id() for _ in range(3)]
    for rid in runs:
        await log.append(TaskSubmitted(text="t", run_id=rid, task_id=rid))
        await log.append(RunStarted(run_id=rid, task_id=rid, source="orchestrator"))
    loader = RunLoader(log, capacity=2)
    for rid in runs:
        assert (await loader.state(rid)).status == "running"
    assert [s.run_id for s in loader.cached()] == runs[1:], "the least recently used went"
    again = await loader.state(runs[0])
    assert again.status == "running" and again.task is not None, "evicted is re-read, not lost"
    assert len(loader.cached()) == 2


async def test_session_approvals_keep_the_most_recent(
    log: EventLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy_module, "SESSION_CAPACITY", 3)
    handler = PolicyHandler(
        log, policy=OPEN_POLICY, keys=KeyRing(tmp_path / "keys"), known_tools=frozenset(),
        default_workspace=tmp_path,
    )  # fmt: skip
    keys = [("default", f"s{i}", "rule", "write") for i in range(5)]
    for i, key in enumerate(keys):
        handler._remember(key, f"a{i}")
    handler._remember(keys[2], "a2")  # used again: stays
    assert list(handler.sessions) == [keys[3], keys[4], keys[2]]


async def test_per_run_bookkeeping_ends_with_the_run(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    reactors = agent_reactors(log, sqlite_engine, ScriptedProvider.from_text(ONE_TOOL), workspace)
    orchestrator, executor = reactors[0], reactors[2]
    assert isinstance(orchestrator, Orchestrator) and isinstance(executor, Executor)
    async with running_host(log, sqlite_engine, reactors):
        tasks = [submit("read the notes", workspace) for _ in range(3)]
        for t in tasks:
            await log.append(t)
        for t in tasks:
            assert t.run_id is not None
            await finished(log, t.run_id)
        # the orchestrator hears its own run.completed after the run's watchers do
        await eventually(lambda: not orchestrator.deadlines)
    assert executor._running == {}
