"""MCP tools in real runs: the scripted model calls them through the orchestrator, the policy
(the bundled default asks), the executor (which owns the sessions) and the audit, on a real
nats-server and SQLite, against a real FastMCP server process."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import agents
from nanocrab.bus import EventLog, read
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.cli.host import Host
from nanocrab.events import (
    AlertRaised,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    GrantDenied,
    LlmRequested,
    RunCompleted,
    ToolCompleted,
    ToolStarted,
)
from nanocrab.handlers.alerts import AlertSink
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.handlers.sessions import SessionIndex
from nanocrab.llm import ScriptedProvider
from nanocrab.mcp import McpHub, load_catalogue
from nanocrab.policy import Policy, load_policy
from nanocrab.projections import AuditProjection, audit_rows
from nanocrab.projections.sessions import session_snapshot
from nanocrab.security import KeyRing, sign, signed_by
from nanocrab.skills import SkillLibrary, bundled_skills_dir
from nanocrab.tools import LocalOperations
from tests.agent_fixtures import FAST, finished, of_type, registry, submit
from tests.conftest import eventually
from tests.mcp_rig import ENV, config, stdio_yaml

SCRIPT = """
scripts:
  - name: add
    match: "add numbers"
    turns:
      - text: "Adding with the calculator server."
        tool_calls: [{name: mcp.fx.add, input: {a: 2, b: 40}}]
      - text: "Done: the server answered."
  - name: crash
    match: "crash"
    turns:
      - tool_calls: [{name: mcp.fx.die, input: {}}]
      - text: "The server went away; I carried on without it."
"""


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@dataclass
class Loop:
    log: EventLog
    engine: AsyncEngine
    keys: KeyRing
    workspace: Path


@contextlib.asynccontextmanager
async def mcp_loop(
    log: EventLog,
    engine: AsyncEngine,
    tmp_path: Path,
    policy: Policy,
    *,
    evil: bool = False,
    sink: AlertSink | None = None,
) -> AsyncIterator[Loop]:
    """The agent loop with the fixture server's tools, wired as build_reactors wires them."""
    cfg = config(stdio_yaml(evil=evil))
    catalogue = await load_catalogue(cfg, ENV)
    hub = McpHub(cfg, ENV)
    tools = catalogue.tools(hub)
    agents.add_default_tools([t.name for t in tools])
    reg = registry(*tools)
    workspace = (tmp_path / "ws").resolve()
    workspace.mkdir()
    keys = KeyRing(tmp_path / "keys")
    policy_keys = frozenset({keys.public_key("policy")})
    reactors = [
        Orchestrator(log, trust=signed_by(policy_keys)),
        PolicyHandler(log, policy=policy, keys=keys, known_tools=frozenset(reg.names()),
                      default_workspace=workspace),
        Executor(log, registry=reg, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
                 default_workspace=workspace, tool_timeout_s=30, trusted_policy=policy_keys,
                 trusted_approvers=trusted_approvers(policy, keys), mcp=hub,
                 notices=catalogue.alerts(), alert_sink=sink),
        LlmHandler(log, provider=ScriptedProvider.from_text(SCRIPT), registry=reg,
                   default_workspace=workspace,
                   skills=SkillLibrary.discover([bundled_skills_dir()]),
                   history=SessionIndex(log, snapshot=partial(session_snapshot, engine))),
    ]  # fmt: skip
    host = Host(log, engine, reactors, projections=[AuditProjection()], options=FAST)
    await host.start()
    try:
        yield Loop(log, engine, keys, workspace)
    finally:
        await host.stop(drain_s=5)  # the executor closes the hub: the server process ends


def approve(loop: Loop, request: ApprovalRequested) -> ApprovalGranted:
    answer = ApprovalGranted(
        approval_id=request.approval_id, approver="approver", binding_hash=request.binding_hash,
        run_id=request.run_id, session_id=request.session_id, task_id=request.task_id,
        source="approver", remember="once",
    )  # fmt: skip
    return sign(answer, loop.keys.keypair("approver"))


async def events_of(log: EventLog, run_id: str) -> list[Event]:
    return [s.event async for s in read(log, log.subjects.run(run_id)) if s.event is not None]


async def test_default_policy_asks_then_the_call_runs_and_is_audited(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    posted: list[dict[str, Any]] = []

    def webhook(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content))
        return httpx.Response(200)

    sink = AlertSink("http://alerts.test/hook", transport=httpx.MockTransport(webhook))
    async with mcp_loop(log, engine, tmp_path, load_policy(), evil=True, sink=sink) as loop:
        task = submit("add numbers please", loop.workspace)
        await log.append(task)
        assert task.run_id is not None

        async def asked() -> ApprovalRequested | None:
            found = of_type(await events_of(log, task.run_id or ""), ApprovalRequested)
            return found[0] if found else None

        request = await eventually(asked)
        assert request.tool == "mcp.fx.add"
        await log.append(approve(loop, request))
        events = await finished(log, task.run_id)
        assert of_type(events, RunCompleted)
        (done,) = of_type(events, ToolCompleted)
        assert not done.is_error and done.tool == "mcp.fx.add"
        assert [b.text for b in done.content] == ["42"]  # type: ignore[union-attr]
        # the model saw the tool with the server's schema
        (first, *_) = of_type(events, LlmRequested)
        assert "mcp.fx.add" in first.tools and "mcp.fx.helpful_search" not in first.tools

        async def row() -> object:
            rows = [r for r in await audit_rows(engine) if r.call_id == done.call_id]
            return rows[0] if rows and rows[0].status == "completed" else None

        audited = await eventually(row, timeout=15)
        assert audited.tool == "mcp.fx.add" and audited.rule == "mcp"  # type: ignore[attr-defined]
        assert audited.approval_required and audited.approval_result == "granted"  # type: ignore[attr-defined]
        assert audited.arguments == {"a": 2, "b": 40}  # type: ignore[attr-defined]

        # the withheld tool's alert, appended by the executor when it started
        async def alert() -> AlertRaised | None:
            async for s in read(log, log.subjects.of_type("alert.raised")):
                if isinstance(s.event, AlertRaised) and s.event.origin == "mcp":
                    return s.event
            return None

        flagged = await eventually(alert, timeout=15)
        assert flagged.tool == "mcp.fx.helpful_search" and flagged.source == "executor"
        assert [p["id"] for p in posted] == [flagged.id]  # the same alert, on the webhook
        # no secret of the server's environment in any event of the run
        assert all(b"s3cret-token-value" not in msgspec.json.encode(e) for e in events)


async def test_a_deny_rule_on_the_server_blocks_its_tools(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    default = load_policy()
    policy = Policy.from_mapping(
        {
            "version": 1,
            "rules": [
                {"id": "no-fx", "tools": ["mcp.fx.*"], "tier": "deny"},
                *[r.model_dump(exclude_none=True) for r in default.rules],
            ],
        }
    )
    async with mcp_loop(log, engine, tmp_path, policy) as loop:
        task = submit("add numbers please", loop.workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
        (denied,) = of_type(events, GrantDenied)
        assert denied.tool == "mcp.fx.add" and denied.rule == "no-fx"
        assert not of_type(events, ToolStarted) and not of_type(events, ApprovalRequested)
        assert of_type(events, RunCompleted)


async def test_a_server_dying_mid_call_fails_the_call_and_the_run_goes_on(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    policy = Policy.from_mapping(
        {"version": 1, "rules": [{"id": "fx", "tools": ["mcp.fx.*"], "tier": "safe"}]}
    )
    async with mcp_loop(log, engine, tmp_path, policy) as loop:
        task = submit("crash the server", loop.workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "", timeout=60)
        (done,) = of_type(events, ToolCompleted)
        assert done.is_error and done.error_kind == "unavailable"
        assert "went away during die" in done.content[0].text  # type: ignore[union-attr]
        (completed,) = of_type(events, RunCompleted)
        assert "carried on" in (completed.reply or "")


async def test_build_reactors_wires_the_servers_of_mcp_yaml(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    nats_url: str,
) -> None:  # fmt: skip
    from nanocrab import demo
    from nanocrab.cli.settings import Settings
    from nanocrab.cli.wiring import build_reactors

    home = tmp_path / "home"
    home.mkdir()
    (home / "mcp.yaml").write_text("version: 1\nservers:\n" + stdio_yaml(evil=True))
    for name in ("NANOCRAB_MCP", "NANOCRAB_CONFIG_DIR", "NANOCRAB_AGENTS", "NANOCRAB_CONNECTORS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FX_TOKEN", "s3cret-token-value")
    monkeypatch.setenv("NANOCRAB_TELEMETRY", "off")
    settings = Settings(
        home=home, nats_url=nats_url, db_url="sqlite+aiosqlite://", traces="none",
        sync="default", provider="scripted", script=demo.SCRIPT, user_skills=tmp_path / "skills",
    )  # fmt: skip
    reactors = build_reactors(log, engine, settings, default_workspace=tmp_path / "ws")
    (executor,) = [r for r in reactors if isinstance(r, Executor)]
    names = executor.registry.names()
    assert "mcp.fx.echo" in names and "mcp.fx.resources.read" in names
    assert "mcp.fx.helpful_search" not in names
    assert [a.tool for a in executor.notices] == ["mcp.fx.helpful_search"]  # type: ignore[attr-defined]
    assert executor.mcp is not None and "fx" in executor.mcp.connections
    assert "mcp.fx.echo" in agents.profile("default").tools
    (policy,) = [r for r in reactors if isinstance(r, PolicyHandler)]
    assert "mcp.fx.echo" in policy.known_tools  # type: ignore[attr-defined]
    assert (home / "mcp-logs" / "fx.log").is_file()
