"""Python agents on the in-process loop (real nats-server): hot reload (issue 14,
docs/agents.md) — the reloader watches the modules ``agents.yaml`` declares, validates a
change by importing it and running its smoke tests in a subprocess, rejects a failing one with
file:line (nothing switches), activates a passing one: the next run uses the new code while a
run in flight finishes on its own; a run resumed by another process (replay of its calls);
an agent's metrics on the Prometheus endpoint."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog, Reactor, read_run
from nanocrab.bus.server import free_port
from nanocrab.events import (
    AgentLogged,
    GrantIssued,
    ReloadActivated,
    ReloadProposed,
    ReloadRejected,
    RunCompleted,
    RunStarted,
    ToolRequested,
)
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.pyagent import PyAgentHandler
from nanocrab.observe import Telemetry, TelemetryHandler
from nanocrab.observe.export import prometheus_reader
from nanocrab.pyagent import Agent, Context, Request, Response, ToolResult
from nanocrab.pyagent.session import Calls, Crashed, Finished, Known, Session, call_id
from nanocrab.reload import BaseConfig, ConfigView, LoadedConfig, Snapshot, collect
from nanocrab.reload.snapshot import relevant
from nanocrab.routing import install_profiles, load_agents, parse_agents
from nanocrab.security import KeyRing
from nanocrab.skills import SkillLibrary, bundled_skills_dir

from .agent_fixtures import OPEN_POLICY, finished, of_type, running_host, submit
from .conftest import eventually
from .reload_rig import OPEN_POLICY_YAML, Model, make_view, next_reload, reload_reactors
from .test_metrics import sample, scrape

AGENTS = """\
version: 1
agents:
  - name: default
    description: The model-driven agent.
  - name: greeter-rl
    description: Reads notes.txt and greets with it.
    module: agents/greeter.py
    class: Greeter
    tools: [read]
"""

GREETER = """\
import asyncio
from pathlib import Path

from nanocrab.pyagent import Agent, Response


class Greeter(Agent):
    async def handle(self, request, context):
        if "hold" in request.text:
            ws = Path(request.workspace)
            (ws / "holding").write_text("yes")
            while not (ws / "release").exists():
                await asyncio.sleep(0.02)
        notes = await context.tools.call("read", {{"path": "notes.txt"}})
        context.log("read the notes")
        return Response("{tag}: " + notes.text.strip())


async def smoke(harness):
    answer = await harness.run("greet", tools={{"read": lambda a: "hello"}})
    assert answer.text == "{expect}: hello", answer.text
"""


def greeter(tag: str, expect: str | None = None) -> str:
    return GREETER.format(tag=tag, expect=expect or tag)


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


async def _is(a: object, b: object) -> bool:
    return a == b


def reply(events: list) -> str:  # type: ignore[type-arg]
    (done,) = of_type(events, RunCompleted)
    text: str = done.reply
    return text


async def test_a_python_agent_edit_is_validated_then_live_for_the_next_run(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n")
    config = tmp_path / "config"
    (config / "agents").mkdir(parents=True)
    (config / "policy.yaml").write_text(OPEN_POLICY_YAML)
    (config / "agents.yaml").write_text(AGENTS)
    module = config / "agents" / "greeter.py"
    module.write_text(greeter("v1"))
    assert "agents/greeter.py" in collect(config).files  # the declared module is configuration
    assert relevant(config, str(module)) and not relevant(config, str(config / "other.py"))

    view = make_view(log, tmp_path / "cache")
    reactors, reloader = reload_reactors(
        log, engine, Model(), ws, view=view, config_dir=config, keys=KeyRing(tmp_path / "k")
    )
    for r in reactors:
        if isinstance(r, LlmHandler):
            r.agents = view  # as cli/wiring.py builds it: the model leaves Python agents alone
    host = PyAgentHandler(log, view=view, health_every_s=None)
    async with running_host(log, engine, [*reactors, host]):
        await asyncio.wait_for(reloader.watching.wait(), 10)
        first = await reloader.propose_now(force=True)
        assert first is not None
        v1 = await next_reload(log, lambda e: isinstance(e, ReloadActivated)
                               and e.version == first.version, timeout=60)  # fmt: skip
        await eventually(lambda: _is(view.active, v1.version))

        held = submit("hold and greet", ws, agent="greeter-rl")
        await log.append(held)
        await eventually(lambda: _is((ws / "holding").exists(), True))  # v1's code is running

        module.write_text(greeter("v2"))  # the watcher sees the save
        v2 = await next_reload(log, lambda e: isinstance(e, ReloadActivated)
                               and e.version != v1.version, timeout=60)  # fmt: skip
        proposed = await next_reload(
            log, lambda e: isinstance(e, ReloadProposed) and e.version == v2.version
        )
        assert isinstance(proposed, ReloadProposed) and proposed.changed == ["agents/greeter.py"]
        await eventually(lambda: _is(view.active, v2.version))

        after = submit("greet", ws, agent="greeter-rl")
        await log.append(after)
        late = await finished(log, after.run_id or "")
        (ws / "release").write_text("go")
        early = await finished(log, held.run_id or "")
        # an agent the start-up configuration did not declare: known once its version is
        assert {of_type(e, RunStarted)[0].agent for e in (early, late)} == {"greeter-rl"}
        assert of_type(early, RunStarted)[0].config == v1.version
        assert of_type(late, RunStarted)[0].config == v2.version
        assert reply(early) == "v1: hello" and reply(late) == "v2: hello"
        assert [t.tool for t in of_type(late, ToolRequested)] == ["read"]
        assert [e.message for e in of_type(late, AgentLogged)] == ["read the notes"]

        # a version whose smoke test fails is rejected with file:line; nothing switches
        module.write_text(greeter("v3", expect="v2"))
        rejected = await next_reload(log, lambda e: isinstance(e, ReloadRejected), timeout=60)
        assert isinstance(rejected, ReloadRejected)
        (problem,) = rejected.problems
        assert problem.file == "agents/greeter.py"
        assert "smoke test failed: v3: hello" in problem.message, problem.message
        assert "assert answer.text" in greeter("v3").splitlines()[problem.line - 1]
        # and one that does not even import
        module.write_text("from nanocrab.pyagent import Agent\n\nclass Greeter(Agent:\n")
        broken = await next_reload(
            log, lambda e: isinstance(e, ReloadRejected) and e.version != rejected.version,
            timeout=60,
        )  # fmt: skip
        assert isinstance(broken, ReloadRejected)
        assert [(p.file, p.line) for p in broken.problems] == [("agents/greeter.py", 3)]
        assert "import failed: SyntaxError" in broken.problems[0].message
        assert view.active == v2.version
        again = submit("greet", ws, agent="greeter-rl")
        await log.append(again)
        assert reply(await finished(log, again.run_id or "")) == "v2: hello"


# -- a session resumed elsewhere (no bus) ----------------------------------------------------


class TwoReads(Agent):
    async def handle(self, request: Request, context: Context) -> Response:
        context.log("start")
        a = await context.tools.call("read", {"path": "a"})
        context.log("between")
        b = await context.tools.call("read", {"path": "b"})
        return Response(a.text + b.text)


def result(text: str, i: int) -> ToolResult:
    return ToolResult(tool="read", call_id=call_id("r", i), text=text)


async def test_a_resumed_session_answers_its_earlier_calls_from_the_log() -> None:
    request = Request(text="x", run_id="r", agent="two", tools=("read",))
    known = [Known("read", {"path": "a"}, result("A", 0))]
    session = Session(TwoReads(), request, known)
    outcome = await session.next(1, timeout_s=10)
    assert isinstance(outcome, Calls)
    (call,) = outcome.calls
    assert (call.index, call.call_id, call.arguments) == (1, call_id("r", 1), {"path": "b"})
    # what it logged before and with its known call went out the first time
    assert [e.message for e in session.take_events()] == ["between"]  # type: ignore[attr-defined]
    session.resolve({call.call_id: result("B", 1)})
    done = await session.next(2, timeout_s=10)
    assert isinstance(done, Finished) and done.response.text == "AB"


async def test_a_session_that_asks_for_other_calls_on_resume_fails_typed() -> None:
    request = Request(text="x", run_id="r", agent="two", tools=("read",))
    known = [Known("read", {"path": "elsewhere"}, result("A", 0))]
    outcome = await Session(TwoReads(), request, known).next(1, timeout_s=10)
    assert isinstance(outcome, Crashed) and outcome.message.startswith("ReplayDiverged")


def test_snapshot_ignores_modules_outside_the_directory(tmp_path: Path) -> None:
    (tmp_path / "agents.yaml").write_text(
        textwrap.dedent(
            """
            version: 1
            agents:
              - {name: default, description: d}
              - {name: a, description: a, module: ../outside.py}
              - {name: b, description: b, module: /abs/b.py}
              - {name: c, description: c, module: in/c.py}
            """
        )
    )
    (tmp_path.parent / "outside.py").write_text("x = 1\n")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "c.py").write_text("y = 2\n")
    assert set(collect(tmp_path).files) == {"agents.yaml", "in/c.py"}
    assert collect(tmp_path) != Snapshot()


# -- a run resumed by another process ---------------------------------------------------------

RESUMED = """\
version: 1
agents:
  - name: default
    description: The model-driven agent.
  - name: two-reads-rs
    description: Reads a.txt then b.txt.
    module: two_reads.py
    tools: [read]
"""

TWO_READS = """\
from nanocrab.pyagent import Agent, Response


class TwoReads(Agent):
    async def handle(self, request, context):
        context.log("start")
        a = await context.tools.call("read", {"path": "a.txt"})
        context.log("between")
        b = await context.tools.call("read", {"path": "b.txt"})
        return Response(a.text.strip() + b.text.strip())
"""


def startup_view(log: EventLog, config: Path, cache: Path) -> ConfigView:
    """A process's view whose start-up configuration declares the agents of ``config``."""
    bundled = bundled_skills_dir()
    startup = LoadedConfig(
        version="", policy=OPEN_POLICY, guardrails=None, guardrails_text=None,
        agents=load_agents(config / "agents.yaml"), skills=SkillLibrary.discover([bundled]),
    )  # fmt: skip
    base = BaseConfig(guardrails=False, skill_dirs=(bundled,), agents_file=config / "agents.yaml")
    return ConfigView(startup, base=base, cache_dir=cache, log=log)


async def test_a_run_moves_to_a_new_process_between_turns(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    install_profiles(parse_agents(RESUMED))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("A\n")
    (ws / "b.txt").write_text("B\n")
    config = tmp_path / "config"
    config.mkdir()
    (config / "agents.yaml").write_text(RESUMED)
    (config / "two_reads.py").write_text(TWO_READS)
    keys = KeyRing(tmp_path / "k")

    def process(n: int, *, executor: bool) -> list[Reactor]:
        view = startup_view(log, config, tmp_path / f"cache{n}")
        reactors, _ = reload_reactors(
            log, engine, Model(), ws, view=view, config_dir=config, keys=keys
        )
        for r in reactors:
            if isinstance(r, LlmHandler):
                r.agents = view
        kept = [r for r in reactors if executor or not isinstance(r, Executor)]
        return [*kept, PyAgentHandler(log, view=view, health_every_s=None)]

    task = submit("read both", ws, agent="two-reads-rs")
    async with running_host(log, engine, process(1, executor=False)):
        await log.append(task)

        async def asked_first() -> bool:  # the agent's first call is granted, not run
            events = [s.event for s in await read_run(log, task.run_id or "")]
            return any(isinstance(e, GrantIssued) for e in events)

        await eventually(asked_first)
    # the first process is gone with the agent waiting in it; the next one takes the run on
    async with running_host(log, engine, process(2, executor=True)):
        events = await finished(log, task.run_id or "")
    assert reply(events) == "AB"
    calls = [(t.tool, t.arguments) for t in of_type(events, ToolRequested)]
    assert calls == [("read", {"path": "a.txt"}), ("read", {"path": "b.txt"})]
    assert [e.message for e in of_type(events, AgentLogged)] == ["start", "between"]


# -- metrics on the Prometheus endpoint ---------------------------------------------------------

MEASURING = """\
version: 1
agents:
  - name: default
    description: The model-driven agent.
  - name: measurer-pm
    description: Measures widgets.
    module: measurer.py
    tools: []
"""

MEASURER = """\
from nanocrab.pyagent import Agent, Response


class Measurer(Agent):
    async def handle(self, request, context):
        context.emit_metric("widgets", 7, unit="{widget}", labels={"color": "red"})
        context.emit_metric("widgets", 5, unit="{widget}", labels={"color": "red"})
        return Response("measured")
"""


async def test_an_agent_s_metrics_reach_the_prometheus_endpoint(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    install_profiles(parse_agents(MEASURING))
    config = tmp_path / "config"
    config.mkdir()
    (config / "agents.yaml").write_text(MEASURING)
    (config / "measurer.py").write_text(MEASURER)
    ws = tmp_path / "ws"
    ws.mkdir()
    port = free_port()
    tele = Telemetry("nanocrab-test", processors=[],
                     readers=[prometheus_reader(port, registry=CollectorRegistry())])  # fmt: skip
    view = startup_view(log, config, tmp_path / "cache")
    reactors, _ = reload_reactors(
        log, engine, Model(), ws, view=view, config_dir=config, keys=KeyRing(tmp_path / "k")
    )
    for r in reactors:
        if isinstance(r, LlmHandler):
            r.agents = view
    reactors += [
        PyAgentHandler(log, view=view, health_every_s=None),
        TelemetryHandler(log, telemetry_=tele),
    ]
    async with running_host(log, engine, reactors):
        task = submit("measure", ws, agent="measurer-pm")
        await log.append(task)
        assert reply(await finished(log, task.run_id or "")) == "measured"
        labels = {"gen_ai_agent_name": "measurer-pm", "nanocrab_agent_metric_name": "widgets",
                  "nanocrab_agent_label_color": "red"}  # fmt: skip

        async def scraped() -> str | None:
            text = await asyncio.to_thread(scrape, port)
            return text if sample(text, "nanocrab_agent_metric_count", **labels) == 2 else None

        text = await eventually(scraped)
    tele.shutdown()
    assert sample(text, "nanocrab_agent_metric_sum", **labels) == 12.0
