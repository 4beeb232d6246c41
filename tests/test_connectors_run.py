"""Connectors in a real run: the scripted model reads mail through the IMAP fixture, a send to
a domain a policy rule denies is refused, a calendar event is added after an approval; the
audit shows each connector and its resources, and the password appears in no event, no
projection row and no log line. Real nats-server, SQLite, IMAP fixture and aiosmtpd."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import icalendar
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import agents
from nanocrab.bus import EventLog, read
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.bus.replay import messages
from nanocrab.cli.host import Host
from nanocrab.connectors import connectors_setup
from nanocrab.events import (
    ApprovalGranted,
    ApprovalRequested,
    Event,
    GrantDenied,
    GrantIssued,
    PlanStepCompleted,
    RunCompleted,
    TextBlock,
    ToolCompleted,
)
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.handlers.sessions import SessionIndex
from nanocrab.llm import ScriptedProvider
from nanocrab.policy import Policy, load_policy
from nanocrab.projections import AuditProjection, audit_rows
from nanocrab.projections.sessions import session_snapshot
from nanocrab.security import KeyRing, sign, signed_by
from nanocrab.skills import SkillLibrary, bundled_skills_dir
from nanocrab.tools import LocalOperations
from tests.agent_fixtures import FAST, finished, of_type, registry, submit
from tests.conftest import eventually
from tests.connector_rig import (
    PASSWORD,
    ImapServer,
    Mail,
    SmtpServer,
    message,
    smtp_server,
    write_config,
)

SCRIPT = """
scripts:
  - name: assistant
    match: "morning"
    turns:
      - text: "Checking the inbox."
        tool_calls: [{name: mail.list, input: {account: work}}]
      - tool_calls: [{name: mail.read, input: {account: work, uid: 2}}]
      - text: "Forwarding the contract."
        tool_calls: [{name: mail.send, input: {account: work, to: [boss@rival.test],
                      subject: "Fwd: Contract", body: "See below."}}]
      - text: "Booking the signing."
        tool_calls: [{name: calendar.add, input: {calendar: team, title: "Contract signing",
                      start: "2026-06-10T15:00:00Z", duration_minutes: 30}}]
      - text: "Done: one mail read, the forward was refused, the signing is booked."
"""


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
async def imap() -> AsyncIterator[ImapServer]:
    server = ImapServer(
        boxes={
            "INBOX": [
                Mail(1, message(1, "alice@example.org", "Lunch?", "Noon?"), True),
                Mail(2, message(2, "bob@partner.test", "Contract", "Signed copy inside.")),
            ]
        }
    )
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    with smtp_server() as server:
        yield server


def policy() -> Policy:
    """The bundled default, with a rule refusing mail to one recipient domain."""
    default = load_policy()
    return Policy.from_mapping(
        {
            "version": 1,
            "rules": [
                {"id": "no-rivals", "tools": ["mail.send"],
                 "resources": ["mail.to:rival.test", "mail.to:*.rival.test"], "tier": "deny"},
                *[r.model_dump(exclude_none=True) for r in default.rules],
            ],
        }
    )  # fmt: skip


@dataclass
class Loop:
    keys: KeyRing
    workspace: Path
    ics: Path


@contextlib.asynccontextmanager
async def connector_loop(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, imap: ImapServer, smtp: SmtpServer,
    script: str, rules: Policy,
) -> AsyncIterator[Loop]:  # fmt: skip
    """The agent loop with the connectors of a connectors.yaml pointing at the fixtures, wired
    as build_reactors wires them, and the audit projection."""
    ics = tmp_path / "calendars" / "team.ics"
    conf = tmp_path / "conf"
    write_config(conf, imap_port=imap.port, smtp_port=smtp.port, calendar=ics)
    setup = connectors_setup(conf, {})
    agents.add_default_tools([t.name for t in setup.tools])
    reg = registry(*setup.tools)
    workspace = (tmp_path / "ws").resolve()
    workspace.mkdir()
    keys = KeyRing(tmp_path / "keys")
    policy_keys = frozenset({keys.public_key("policy")})
    reactors = [
        Orchestrator(log, trust=signed_by(policy_keys)),
        PolicyHandler(log, policy=rules, keys=keys, known_tools=frozenset(reg.names()),
                      default_workspace=workspace, resources_of=setup.resources,
                      protected=setup.protected),
        Executor(log, registry=reg, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
                 default_workspace=workspace, tool_timeout_s=30, trusted_policy=policy_keys,
                 trusted_approvers=trusted_approvers(rules, keys)),
        LlmHandler(log, provider=ScriptedProvider.from_text(script), registry=reg,
                   default_workspace=workspace,
                   skills=SkillLibrary.discover([bundled_skills_dir()]),
                   history=SessionIndex(log, snapshot=partial(session_snapshot, engine))),
    ]  # fmt: skip
    host = Host(log, engine, reactors, projections=[AuditProjection()], options=FAST)
    await host.start()
    try:
        yield Loop(keys, workspace, ics)
    finally:
        await host.stop(drain_s=5)


def approval(keys: KeyRing, request: ApprovalRequested) -> ApprovalGranted:
    answer = ApprovalGranted(
        approval_id=request.approval_id, approver="approver", binding_hash=request.binding_hash,
        run_id=request.run_id, session_id=request.session_id, task_id=request.task_id,
        source="approver", remember="once",
    )  # fmt: skip
    return sign(answer, keys.keypair("approver"))


async def first_approval(log: EventLog, run_id: str) -> ApprovalRequested:
    async def asked() -> ApprovalRequested | None:
        found = of_type(await events_of(log, run_id), ApprovalRequested)
        return found[0] if found else None

    request: ApprovalRequested = await eventually(asked)
    return request


async def test_a_run_reads_mail_is_refused_a_send_and_adds_an_event_after_approval(
    log: EventLog,
    engine: AsyncEngine,
    tmp_path: Path,
    imap: ImapServer,
    smtp: SmtpServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with connector_loop(log, engine, tmp_path, imap, smtp, SCRIPT, policy()) as loop:
        task = submit("good morning, triage my mail", loop.workspace)
        await log.append(task)
        run_id = task.run_id or ""
        request = await first_approval(log, run_id)
        assert request.tool == "calendar.add" and request.rule == "connectors-calendar-add"
        assert [c.resource for c in request.capabilities] == ["calendar:team"]
        assert not loop.ics.exists()  # nothing added before the approval
        await log.append(approval(loop.keys, request))
        events = await finished(log, run_id)
        assert of_type(events, RunCompleted)

        done = {c.tool: c for c in of_type(events, ToolCompleted)}
        assert not done["mail.list"].is_error and "Contract" in text(done["mail.list"])
        assert not done["mail.read"].is_error and "Signed copy inside." in text(done["mail.read"])
        assert not done["calendar.add"].is_error, text(done["calendar.add"])
        (denied,) = of_type(events, GrantDenied)
        assert denied.tool == "mail.send" and denied.rule == "no-rivals"
        assert "mail.send" not in done  # never reached the executor
        assert smtp.received == [] and smtp.logins == []
        cal = icalendar.Calendar.from_ical(loop.ics.read_bytes())
        assert [str(e["SUMMARY"]) for e in cal.walk("VEVENT")] == ["Contract signing"]

        async def rows() -> list[object] | None:
            found = await audit_rows(engine, run_id=run_id)
            settled = [r for r in found if r.status in ("completed", "denied")]
            return found if len(settled) == 4 else None

        audited = {r.tool: r for r in await eventually(rows, timeout=20)}  # type: ignore[attr-defined]
        listed = audited["mail.list"]
        assert listed.rule == "connectors-read" and listed.tier == "safe"
        assert listed.granted_capabilities == [
            {"tool": "mail.list", "resource": "mail:work/INBOX", "access": "read"}
        ]
        assert audited["mail.read"].granted_capabilities[0]["resource"] == "mail:work/INBOX"
        added = audited["calendar.add"]
        assert added.approval_required and added.approval_result == "granted"
        assert added.granted_capabilities == [
            {"tool": "calendar.add", "resource": "calendar:team", "access": "write"}
        ]
        refused = audited["mail.send"]
        assert refused.rule == "no-rivals" and refused.status == "denied"
    await engine.dispose()  # flush SQLite's WAL into the file read below

    # the secret went to the IMAP server's LOGIN and nowhere else
    assert any(PASSWORD in c for c in imap.commands if c.startswith("LOGIN"))
    secret = PASSWORD.encode()
    stored = [m.data async for m in messages(log, log.subjects.log_all)]
    assert len(stored) > 10 and all(secret not in data for data in stored)
    assert not holding(tmp_path, "projections.db*", secret)  # the SQLite audit, WAL included
    assert PASSWORD not in caplog.text


async def events_of(log: EventLog, run_id: str) -> list[Event]:
    return [s.event async for s in read(log, log.subjects.run(run_id)) if s.event is not None]


def holding(directory: Path, pattern: str, secret: bytes) -> list[Path]:
    files = list(directory.glob(pattern))
    assert files
    return [f for f in files if secret in f.read_bytes()]


def text(done: ToolCompleted) -> str:
    return "\n".join(b.text for b in done.content if isinstance(b, TextBlock))


async def test_build_reactors_wires_the_connectors_of_connectors_yaml(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    nats_url: str,
) -> None:  # fmt: skip
    from nanocrab import demo
    from nanocrab.cli.settings import Settings
    from nanocrab.cli.wiring import build_reactors

    home = tmp_path / "home"
    write_config(home, imap_port=1, smtp_port=1, calendar=tmp_path / "team.ics")
    for name in ("NANOCRAB_MCP", "NANOCRAB_CONFIG_DIR", "NANOCRAB_AGENTS", "NANOCRAB_CONNECTORS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NANOCRAB_TELEMETRY", "off")
    settings = Settings(
        home=home, nats_url=nats_url, db_url="sqlite+aiosqlite://", traces="none",
        sync="default", provider="scripted", script=demo.SCRIPT, user_skills=tmp_path / "skills",
    )  # fmt: skip
    reactors = build_reactors(log, engine, settings, default_workspace=tmp_path / "ws")
    (executor,) = [r for r in reactors if isinstance(r, Executor)]
    connector_tools = ["calendar.add", "calendar.list", "mail.list", "mail.read", "mail.send"]
    assert set(connector_tools) <= set(executor.registry.names())
    assert set(connector_tools) <= set(agents.profile("default").tools)
    (policy,) = [r for r in reactors if isinstance(r, PolicyHandler)]
    assert set(connector_tools) <= policy.known_tools  # type: ignore[attr-defined]
    lookup = policy.resources_of  # type: ignore[attr-defined]
    added = lookup("calendar.add", {"calendar": "team", "title": "t", "start": "2026-01-01T10:00"})
    assert added.names == ("calendar:team",) and added.access == "write"
    assert str(home / "credentials.yaml") in policy.protected  # type: ignore[attr-defined]


PLANNED = """
scripts:
  - name: plan
    match: "plan my morning"
    turns:
      - tool_calls:
          - name: plan
            input:
              steps:
                - {intent: "read the inbox", tools: [mail.list, mail.read],
                   resources: ["mail:work/INBOX"]}
                - {intent: "book the signing", tools: [calendar.add], resources: ["calendar:team"]}
                - {intent: "report", tools: []}
      - tool_calls: [{name: mail.list, input: {account: work}}]
      - tool_calls: [{name: mail.read, input: {account: work, uid: 2}}]
      - text: "Bob sent the signed contract."
      - tool_calls: [{name: calendar.add, input: {calendar: team, title: "Contract signing",
                      start: "2026-06-10T15:00:00Z"}}]
      - text: "Booked."
      - text: "Done: the contract is signed and the signing is booked."
"""


async def test_a_planned_run_reads_mail_then_adds_an_event_under_the_steps_approval(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, imap: ImapServer, smtp: SmtpServer
) -> None:
    """Plan → Step → Action with connectors: three steps; the mail step's reads are Safe; the
    calendar step declared calendar:team, so one approval of the step grants its add; the audit
    names the grant of each call and the step approval behind the add."""
    agents.PROFILES["planner"] = agents.AgentProfile(
        name="planner", description="plans first", system_prompt="Plan, then act.",
        tools=("mail.list", "mail.read", "calendar.add", "plan"), planner=True,
    )  # fmt: skip
    async with connector_loop(log, engine, tmp_path, imap, smtp, PLANNED, load_policy()) as loop:
        task = submit("plan my morning", loop.workspace, agent="planner")
        await log.append(task)
        run_id = task.run_id or ""
        step = await first_approval(log, run_id)
        assert step.about == "plan_step" and step.arguments["intent"] == "book the signing"
        assert step.arguments["resources"] == ["calendar:team"]
        await log.append(approval(loop.keys, step))
        events = await finished(log, run_id)
        assert of_type(events, RunCompleted)
        assert [s.index for s in of_type(events, PlanStepCompleted)] == [0, 1, 2]
        assert len(of_type(events, ApprovalRequested)) == 1  # the step's, nothing per call
        grants = {g.tool: g for g in of_type(events, GrantIssued)}
        assert grants["calendar.add"].approval_id == step.approval_id
        assert grants["mail.read"].tier == "safe" and grants["mail.read"].approval_id is None
        cal = icalendar.Calendar.from_ical(loop.ics.read_bytes())
        assert [str(e["SUMMARY"]) for e in cal.walk("VEVENT")] == ["Contract signing"]

        async def rows() -> dict[str, Any] | None:
            found = {r.tool or "": r for r in await audit_rows(engine, run_id=run_id)}
            calls = ("mail.list", "mail.read", "calendar.add")
            done = all(c in found and found[c].status == "completed" for c in calls)
            return found if done else None

        audited = await eventually(rows, timeout=20)
        for tool in ("mail.list", "mail.read", "calendar.add"):
            assert audited[tool].grant_id == grants[tool].grant_id
        added = audited["calendar.add"]
        assert added.approval_id == step.approval_id and added.approval_result == "granted"
        assert added.granted_capabilities == [
            {"tool": "calendar.add", "resource": "calendar:team", "access": "write"}
        ]
        assert audited["mail.read"].granted_capabilities[0]["resource"] == "mail:work/INBOX"
