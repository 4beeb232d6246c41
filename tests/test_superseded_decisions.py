"""A decision dropped because the run moved on is made again on the event that moved it.

The orchestrator appends each decision expecting the run's last sequence; when another writer's
event lands between the orchestrator's read of the run and that append, the decision is dropped
and the newer event decides instead. So every run event another writer can append must be
delivered to the orchestrator, even one no decision reads. An alert was not (nor a Python
agent's log line or metric): a blocking guardrail verdict and its alert are two appends, and a
decision on the verdict read before the alert landed left the run waiting for good (CI found it
as an intermittent 30 s hang of tests/test_guardrails_handler.py).

The race is forced: the orchestrator's first read of the run is followed, before it decides, by
the append of such an event.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import EventLog
from nanocrab.events import (
    AgentLogged,
    AgentMetric,
    AlertRaised,
    Event,
    RunCompleted,
    RunStarted,
    new_event_id,
)
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.handlers.runstate import RunState
from nanocrab.llm import ScriptedProvider

from .agent_fixtures import agent_reactors, finished, of_type, running_host, submit

SCRIPT = """
scripts:
  - name: main
    turns:
      - text: "done"
"""

LANDING: dict[str, Callable[[], Event]] = {
    "alert": lambda: AlertRaised(severity="warning", origin="guardrail", summary="look"),
    "agent log line": lambda: AgentLogged(agent="py", message="thinking"),
    "agent metric": lambda: AgentMetric(agent="py", name="steps", value=1.0),
}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return demo.make_workspace(tmp_path / "ws")


@pytest.mark.parametrize("kind", sorted(LANDING))
async def test_an_event_landing_before_the_decision_does_not_stall_the_run(
    log: EventLog, sqlite_engine: AsyncEngine, workspace: Path, kind: str
) -> None:
    reactors = agent_reactors(log, sqlite_engine, ScriptedProvider.from_text(SCRIPT), workspace)
    (orchestrator,) = [r for r in reactors if isinstance(r, Orchestrator)]
    task = submit("say done", workspace)
    landed: list[Event] = []
    read = orchestrator.loader.state

    async def racing(run_id: str) -> RunState:
        state = await read(run_id)
        if run_id == task.run_id and not landed:  # between this read and the decision's append
            event = LANDING[kind]()
            event = type(event)(**{
                **{f: getattr(event, f) for f in event.__struct_fields__},
                "id": new_event_id(), "run_id": task.run_id, "task_id": task.task_id,
                "session_id": task.session_id,
            })  # fmt: skip
            await log.append(event)
            landed.append(event)
        return state

    orchestrator.loader.state = racing  # type: ignore[method-assign]
    async with running_host(log, sqlite_engine, reactors):
        await log.append(task)
        events = await finished(log, task.run_id or "")

    ids = [e.id for e in events]
    (started,) = of_type(events, RunStarted)
    assert ids.index(landed[0].id) < ids.index(started.id)  # the first decision was superseded
    (done,) = of_type(events, RunCompleted)
    assert done.reply == "done"
