"""Python agents (docs/agents.md) against a real ``nanocrab up`` (embedded nats-server, every
handler under its own broker identity, the projections, the offline model): the two example
agents of ``examples/agents`` end to end, a policy denial the agent sees, routing to a Python
agent, a crashing agent failing its run (typed), and the smoke check of a module."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nanocrab.bus import BusConfig, EventLog, read, read_run
from nanocrab.events import (
    AgentHealth,
    AgentLogged,
    AgentMetric,
    Event,
    GrantDenied,
    GrantIssued,
    LlmFailed,
    LlmRequested,
    LlmResponded,
    RouteDecided,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    TaskSubmitted,
    ToolCompleted,
    ToolRequested,
    new_event_id,
)
from nanocrab.pyagent import Harness
from nanocrab.pyagent.code import AgentLoadError, load
from nanocrab.pyagent.smoke import check

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "agents"
NANOCRAB = [sys.executable, "-m", "nanocrab"]

CRASHER = textwrap.dedent(
    """
    from nanocrab.pyagent import Agent, Response


    class Crasher(Agent):
        async def handle(self, request, context):
            listing = await context.tools.call("ls", {"path": "."})
            context.log("about to divide")
            return Response(str(len(listing.text) // 0))
    """
)

SLEEPER = textwrap.dedent(
    """
    import asyncio
    from pathlib import Path

    from nanocrab.pyagent import Agent, Response


    class Sleeper(Agent):
        async def handle(self, request, context):
            try:
                await asyncio.sleep(3600)
            finally:
                Path(request.workspace or ".", "sleeper-stopped").write_text(request.run_id)
            return Response("slept")
    """
)

AGENTS_YAML = f"""\
version: 1
default: default
agents:
  - name: default
    description: A general engineering agent working in one workspace directory.
  - name: todo-counter
    description: Counts TODO markers in the files of the workspace.
    examples: ["how many TODOs are left", "count the TODO comments"]
    module: {EXAMPLES / "todo_counter.py"}
    class: TodoCounter
    tools: [ls, grep, read]
  - name: notes-reporter
    description: Reports what long-term memory holds about a topic.
    examples: ["what do we know about the parser", "report on deployments"]
    module: {EXAMPLES / "notes_reporter.py"}
    tools: [recall, remember]
  - name: crasher
    description: Divides by zero after listing the workspace.
    module: crasher.py
    tools: [ls]
  - name: sleeper
    description: Sleeps for an hour.
    module: sleeper.py
    tools: []
"""


@dataclass
class Up:
    home: Path
    workspace: Path


def user_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANOCRAB_", "ANTHROPIC_"))}
    env.update({"NANOCRAB_HOME": str(home), "COLUMNS": "160", **extra})
    return env


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("pyagent")
    home, ws = tmp / "home", tmp / "ws"
    home.mkdir()
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("# TODO one\nx = 1\n# TODO two\n")
    (ws / "b.py").write_text("y = 2  # TODO three\n")
    (ws / "README.md").write_text("nothing to do here\n")
    (home / "agents.yaml").write_text(AGENTS_YAML)
    (home / "crasher.py").write_text(CRASHER)
    (home / "sleeper.py").write_text(SLEEPER)
    env = user_env(home, NANOCRAB_GUARDRAILS="none")
    proc = subprocess.Popen(
        [*NANOCRAB, "up"], cwd=ws, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "nanocrab up" in banner, banner + (
            proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
        )
        yield Up(home, ws)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if "Traceback" in err:
            print(f"nanocrab up's stderr:\n{err[-8000:]}", file=sys.stderr)


@contextlib.asynccontextmanager
async def bus_of(up: Up) -> AsyncIterator[EventLog]:
    """The running server's log, as the ``cli`` identity (it may submit tasks)."""
    from nanocrab.cli.host import bus_session

    async with bus_session(BusConfig(data_dir=up.home), name="test") as (log, server):
        assert server is None or not server.owned, "the test must meet up's server"
        yield log


async def run_task(up: Up, text: str, agent: str = "default") -> list[Event]:
    """Submit ``text`` (to ``agent``) and return the run's events once it ended."""
    async with bus_of(up) as log:
        rid = new_event_id()
        await log.append(TaskSubmitted(text=text, agent=agent, run_id=rid, task_id=rid,
                                       session_id=new_event_id()))  # fmt: skip

        async def ended() -> None:
            async for s in read(log, log.subjects.run(rid), follow=True):
                if isinstance(s.event, RunCompleted | RunFailed):
                    return

        await asyncio.wait_for(ended(), 60)
        return [s.event for s in await read_run(log, rid) if s.event is not None]


def of(events: list[Event], cls: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, cls)]


# -- end to end ------------------------------------------------------------------------------


async def test_todo_counter_runs_its_tools_through_the_policy_and_executor(up: Up) -> None:
    events = await run_task(up, "count TODOs", agent="todo-counter")
    (started,) = of(events, RunStarted)
    assert started.agent == "todo-counter"
    (done,) = of(events, RunCompleted)
    assert done.reply.startswith("3 TODOs in 2 files (b.py: 1, src/a.py: 2)"), done.reply
    assert "Most in src/a.py (2), first: # TODO one" in done.reply
    # the same vocabulary as a model's run: each call requested, granted (signed), completed
    assert [r.tool for r in of(events, ToolRequested)] == ["ls", "grep", "read"]
    assert [g.tool for g in of(events, GrantIssued)] == ["ls", "grep", "read"]
    assert [c.tool for c in of(events, ToolCompleted) if not c.is_error] == ["ls", "grep", "read"]
    answers = of(events, LlmResponded)
    assert {a.provider for a in answers} == {"python"} and len(answers) == 4
    assert all(a.source == "pyagent" for a in answers)
    (metric,) = of(events, AgentMetric)
    assert (metric.name, metric.value, metric.labels) == ("todos", 3.0, {"scope": "."})


async def test_a_denied_call_comes_back_to_the_agent_as_a_denial(up: Up) -> None:
    events = await run_task(up, "count TODOs in /etc", agent="todo-counter")
    (denied,) = of(events, GrantDenied)
    assert denied.tool == "ls" and not of(events, GrantIssued)
    assert not [c for c in of(events, ToolCompleted) if not c.is_error]  # nothing ran
    (done,) = of(events, RunCompleted)
    assert done.reply.startswith("I may not look in /etc: denied by policy:"), done.reply
    assert denied.reason in done.reply
    (warning,) = of(events, AgentLogged)
    assert warning.level == "warning" and "/etc" in warning.message


async def test_notes_reporter_recalls_remembers_and_emits_metrics(up: Up) -> None:
    first = await run_task(up, "report on parsers", agent="notes-reporter")
    assert [r.tool for r in of(first, ToolRequested)] == ["recall", "remember"]
    (done,) = of(first, RunCompleted)
    assert done.reply == "Nothing in memory about parsers.", done.reply
    metrics = {m.name: m for m in of(first, AgentMetric)}
    assert metrics["memories_found"].value == 0.0 and metrics["recall_ms"].unit == "ms"
    assert [log.message for log in of(first, AgentLogged)] == [
        "recalled 0 memories about 'parsers'"
    ]

    # the note it remembered is found by the next run (memory projection → recall tool)
    async def found() -> list[Event] | None:
        again = await run_task(up, "report on parsers", agent="notes-reporter")
        (reply,) = of(again, RunCompleted)
        return again if "reported on parsers" in reply.reply else None

    from .conftest import eventually

    second = await eventually(found, timeout=60, interval=0.5)
    assert of(second, AgentMetric)[0].value >= 1.0


async def test_a_task_naming_no_agent_is_routed_to_a_python_agent(up: Up) -> None:
    events = await run_task(up, "how many TODOs are left")
    (route,) = of(events, RouteDecided)
    assert route.agent == "todo-counter", route
    assert of(events, RunStarted)[0].agent == "todo-counter"
    assert of(events, RunCompleted)[0].reply.startswith("3 TODOs")


async def test_a_crashing_agent_fails_its_run_not_the_handler(up: Up) -> None:
    events = await run_task(up, "divide", agent="crasher")
    (failed,) = of(events, RunFailed)
    assert failed.kind == "agent"
    assert "ZeroDivisionError" in failed.reason, failed.reason
    (llm_failed,) = of(events, LlmFailed)
    assert llm_failed.kind == "agent" and llm_failed.source == "pyagent"
    trace = [e for e in of(events, AgentLogged) if e.level == "error"]
    assert trace and "crasher.py" in trace[0].message
    assert [e.message for e in of(events, AgentLogged) if e.level == "info"] == ["about to divide"]
    # the handler lives on: the next run of a Python agent completes
    again = await run_task(up, "count TODOs", agent="todo-counter")
    assert of(again, RunCompleted)


async def test_cancelling_a_run_stops_its_agent(up: Up) -> None:
    async with bus_of(up) as log:
        rid = new_event_id()
        await log.append(TaskSubmitted(text="sleep", agent="sleeper", run_id=rid, task_id=rid,
                                       session_id=new_event_id()))  # fmt: skip

        async def asked() -> bool:
            return any(isinstance(s.event, LlmRequested) for s in await read_run(log, rid))

        from .conftest import eventually

        await eventually(asked)
        await log.append(RunCancelled(run_id=rid, reason="enough", session_id=rid))
        stopped = up.workspace / "sleeper-stopped"
        await eventually(lambda: _exists(stopped, rid), timeout=30)
        events = [s.event for s in await read_run(log, rid)]
        assert not [e for e in events if isinstance(e, LlmResponded | LlmFailed)]


async def _exists(path: Path, text: str) -> bool:
    def check() -> bool:
        return path.is_file() and path.read_text() == text

    return await asyncio.to_thread(check)


async def test_health_checks_are_recorded(up: Up) -> None:
    async with bus_of(up) as log:

        async def healthy() -> set[str] | None:
            seen = {
                s.event.agent
                for s in await _all(log, "agent.health")
                if isinstance(s.event, AgentHealth) and s.event.healthy
            }
            return (
                seen if {"todo-counter", "notes-reporter", "crasher", "sleeper"} <= seen else None
            )

        from .conftest import eventually

        assert await eventually(healthy, timeout=30)


async def _all(log: EventLog, event_type: str) -> list:  # type: ignore[type-arg]
    out = []
    async for s in read(log, log.subjects.of_type(event_type)):
        out.append(s)
    return out


# -- without a bus ---------------------------------------------------------------------------


async def test_the_examples_pass_their_own_smoke_tests_in_process() -> None:
    for name, cls in (("todo_counter.py", "TodoCounter"), ("notes_reporter.py", None)):
        loaded = load(EXAMPLES / name, cls)
        assert loaded.smoke is not None
        await loaded.smoke(Harness(loaded.agent))


def test_smoke_check_passes_a_good_module_in_a_subprocess() -> None:
    outcome = check(EXAMPLES / "todo_counter.py", "TodoCounter", timeout_s=60)
    assert outcome.ok, outcome.message


def test_smoke_check_names_the_line_of_a_failing_smoke_test(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "todo_counter.py", tmp_path / "todo.py")
    text = (tmp_path / "todo.py").read_text()
    broken = text.replace('startswith("3 TODOs in 2 files")', 'startswith("4 TODOs")')
    (tmp_path / "todo.py").write_text(broken)
    outcome = check(tmp_path / "todo.py", "TodoCounter", timeout_s=60)
    assert not outcome.ok
    assert outcome.message.startswith("smoke test failed: 3 TODOs"), outcome.message
    line = broken.splitlines()[outcome.line - 1]
    assert "4 TODOs" in line, (outcome.line, line)


def test_smoke_check_reports_import_errors_and_hangs(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import json\n\nx = json.loads('{')\n")
    outcome = check(tmp_path / "bad.py", None, timeout_s=60)
    assert not outcome.ok and outcome.line == 3, outcome
    assert "import failed: JSONDecodeError" in outcome.message
    (tmp_path / "hang.py").write_text("import time\nwhile True:\n    time.sleep(1)\n")
    outcome = check(tmp_path / "hang.py", None, timeout_s=3)
    assert not outcome.ok and "longer than 3 s" in outcome.message


def test_a_module_without_a_clear_agent_class_is_refused(tmp_path: Path) -> None:
    (tmp_path / "two.py").write_text(
        "from nanocrab.pyagent import Agent\nclass A(Agent):\n    async def handle(self, r, c):"
        "\n        pass\nclass B(A):\n    pass\n"
    )
    with pytest.raises(AgentLoadError, match="subclasses found: 2: A, B"):
        load(tmp_path / "two.py")
    assert load(tmp_path / "two.py", "B").agent.__class__.__name__ == "B"
