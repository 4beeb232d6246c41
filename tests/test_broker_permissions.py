"""Broker-level permissions (DESIGN §8): each identity publishes only its own event families.

A dedicated nats-server runs with the rendered ``authorization`` block; every refused publish is
checked against the log with the admin connection afterwards (nothing stored).
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import json
import re
from collections.abc import AsyncIterator, Coroutine, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import nats.errors
import nkeys
import pytest
from nats.js.api import ConsumerConfig, StreamConfig
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import (
    AuthenticationFailed,
    BusConfig,
    BusError,
    Connector,
    EmbeddedServer,
    HandlerRuntime,
    PublishRefused,
    ServerStartError,
    connect,
    read,
    read_run,
)
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.bus.direct import DirectReader
from nanocrab.bus.permissions import (
    ADMIN,
    APPROVER,
    IDENTITIES,
    MAY_PUBLISH,
    RUNTIME_IDENTITIES,
    auth_config,
    may_publish,
    publish_allow,
)
from nanocrab.bus.runtime import RuntimeOptions
from nanocrab.bus.server import free_port
from nanocrab.cli.host import Host, bus_connector, bus_session
from nanocrab.cli.settings import Settings
from nanocrab.cli.wiring import build_reactors
from nanocrab.events import (
    EVENT_TYPES,
    ApprovalGranted,
    BusDeadLettered,
    Event,
    GrantIssued,
    LlmRequested,
    RunCompleted,
    RunFailed,
    SubagentSpawned,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolResolved,
    new_event_id,
    utcnow,
)
from nanocrab.llm import ScriptedProvider
from nanocrab.projections import BusSpec, Projector, all_projections
from nanocrab.security import KeyRing, new_seed

from .conftest import eventually

ROOT = "perm"
MANAGE_STREAMS = re.compile(r"\$JS\.API\.STREAM\.(CREATE|UPDATE|DELETE|PURGE|MSG\.DELETE)\.")
FAST = RuntimeOptions(fetch_timeout_s=0.5, ack_wait_s=5.0, backoff_s=(0.1, 0.2), max_deliver=4)


# --- the rendered table (no server) ---------------------------------------------------------


def test_every_pattern_names_real_event_types() -> None:
    for identity, patterns in MAY_PUBLISH.items():
        for pattern in patterns:
            assert any(fnmatch.fnmatchcase(t, pattern) for t in EVENT_TYPES), (identity, pattern)
    assert set(IDENTITIES) == {*MAY_PUBLISH, ADMIN}


def test_the_auth_block_gives_each_identity_its_key_and_only_its_families() -> None:
    keys = {name: nkeys.from_seed(bytearray(new_seed())).public_key.decode() for name in IDENTITIES}
    cfg = BusConfig(root="nanocrab")
    block = auth_config(keys, cfg)
    users = re.findall(r"# (\w+):.*\n\s+\{ nkey: (U\w+), permissions: \{\n([^}]*)\]", block)
    assert {(name, key) for name, key, _ in users} == set(keys.items())
    allowed = {name: body for name, _, body in users}
    for event_type in EVENT_TYPES:
        family, name = event_type.split(".")
        subject = f'"nanocrab.*.*.*.{family}.{name}"'
        wildcard = f'"nanocrab.*.*.*.{family}.*"'
        holders = {i for i, body in allowed.items() if subject in body or wildcard in body}
        assert holders == {i for i in IDENTITIES if i != ADMIN and may_publish(i, event_type)}
    holders = {i for i in IDENTITIES if i != ADMIN and may_publish(i, "guardrail.checked")}
    assert holders == {"guardrails"}, "only the guardrails may publish guardrail.checked"
    holders = {i for i in IDENTITIES if i != ADMIN and may_publish(i, "alert.raised")}
    assert holders == {"guardrails", "reloader", "telemetry", "executor"}, (
        "alerts: guardrails, the reloader's rollbacks, telemetry (budgets, dead letters, lag), "
        "the executor's withheld MCP tools"
    )
    assert not any(may_publish("guardrails", t) for t in EVENT_TYPES
                   if not t.startswith(("guardrail.", "alert.", "bus."))), "verdicts only"  # fmt: skip
    grant_holders = {i for i in IDENTITIES if i != ADMIN and may_publish(i, "grant.issued")}
    assert grant_holders == {"policy"}, "only policy may issue grants"
    for answer in ("approval.granted", "approval.denied"):
        holders = {i for i in IDENTITIES if i != ADMIN and may_publish(i, answer)}
        assert holders == {APPROVER}, f"only approval front ends may publish {answer}"
    assert '">"' in allowed["admin"]
    for identity in IDENTITIES:
        if identity == ADMIN:
            continue
        subjects = publish_allow(identity, cfg)
        managing = [s for s in subjects if MANAGE_STREAMS.match(s)]
        assert managing == [], f"{identity} may manage streams: {managing}"
    assert "nanocrab_eph.*.*.*.llm.*" in publish_allow("llm", cfg), "deltas are ephemeral"
    assert "$O.nanocrab_artifacts.>" in publish_allow("executor", cfg)
    assert not any(s.startswith("$O.") for s in publish_allow("llm", cfg))


def test_the_documented_table_is_the_code_s_table() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "security.md").read_text()
    for identity, patterns in MAY_PUBLISH.items():
        (row,) = [line for line in doc.splitlines() if line.startswith(f"| `{identity}` | ")]
        documented = row.split(" | ")[1]
        assert re.findall(r"`([a-z_.*]+)`", documented) == list(patterns), identity


# --- a dedicated server with the auth block --------------------------------------------------


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[EmbeddedServer, Path]]:
    """A server of its own per test: handler durables start from the log's beginning."""
    home = tmp_path / "secured"
    keyring = KeyRing(home / "keys")
    cfg = BusConfig(data_dir=home, root=ROOT)
    block = auth_config({n: keyring.public_key(n) for n in IDENTITIES}, cfg)
    server = EmbeddedServer(home, port=free_port(), authorization=block)
    server.start()
    assert server.owned
    yield server, home
    server.stop()


@pytest.fixture
async def bus(secured: tuple[EmbeddedServer, Path]) -> AsyncIterator[Connector]:
    server, home = secured
    assert server.url
    cfg = BusConfig(url=server.url, data_dir=home, root=ROOT, auth=True, append_timeout_s=3.0)
    connector = Connector(server.url, cfg, seeds=KeyRing(cfg.keys_dir).seed, name="test")
    await connector.setup()
    yield connector
    await connector.close()


def grant(run_id: str) -> GrantIssued:
    return GrantIssued(
        grant_id=new_event_id(), call_id="c1", tool="write", capabilities=[], scope="step",
        tier="safe", expires_at=utcnow() + timedelta(minutes=5), run_id=run_id, source="forger",
    )  # fmt: skip


def answer(run_id: str) -> ApprovalGranted:
    return ApprovalGranted(approval_id="a1", approver="mallory", run_id=run_id, source="forger")


async def stored(bus: Connector, run_id: str, event: Event) -> bool:
    """Whether ``event`` is in the log, read with the admin identity."""
    admin = await bus.open(ADMIN)
    return any(
        s.event is not None and s.event.id == event.id for s in await read_run(admin, run_id)
    )


async def assert_refused(bus: Connector, identity: str, event: Event) -> None:
    log = await bus.open(identity)
    # PublishRefused (from the server's permissions violation), not an ack timeout
    with pytest.raises(PublishRefused) as refused:
        await log.append(event)
    assert refused.value.identity == identity
    assert refused.value.subject == log.subjects.for_event(event)
    assert repr(identity) in str(refused.value) and event.type in str(refused.value)
    assert not await stored(bus, event.run_id or "", event)


async def test_llm_cannot_issue_a_grant(bus: Connector) -> None:
    await assert_refused(bus, "llm", grant(new_event_id()))


async def test_cli_can_neither_issue_grants_nor_answer_approvals(bus: Connector) -> None:
    run = new_event_id()
    await assert_refused(bus, "cli", grant(run))
    await assert_refused(bus, "cli", answer(run))
    task = TaskSubmitted(text="mine to send", run_id=run)
    await (await bus.open("cli")).append(task)
    assert await stored(bus, run, task)


async def test_executor_cannot_answer_an_approval(bus: Connector) -> None:
    await assert_refused(bus, "executor", answer(new_event_id()))


async def test_only_the_executor_publishes_tool_completed(bus: Connector) -> None:
    """The orchestrator settles its own tools' calls with ``tool.resolved``; a result under the
    executor's type from it is refused (the run state would believe it for a granted call)."""
    run = new_event_id()
    result = ToolCompleted(call_id="c1", tool="write", content=[TextBlock("done")], run_id=run)
    await assert_refused(bus, "orchestrator", result)
    await (await bus.open("executor")).append(result)
    assert await stored(bus, run, result)
    own = ToolResolved(call_id="c2", tool="spawn", content=[TextBlock("child said")], run_id=run)
    await (await bus.open("orchestrator")).append(own)
    assert await stored(bus, run, own)
    await assert_refused(bus, "executor", ToolResolved(call_id="c3", tool="write", run_id=run))


async def test_policy_issues_grants(bus: Connector) -> None:
    run = new_event_id()
    issued = grant(run)
    appended = await (await bus.open("policy")).append(issued)
    assert appended.seq > 0 and await stored(bus, run, issued)


async def test_approver_answers_approvals_and_nothing_else(bus: Connector) -> None:
    run = new_event_id()
    yes = answer(run)
    await (await bus.open(APPROVER)).append(yes)
    assert await stored(bus, run, yes)
    await assert_refused(bus, APPROVER, grant(run))


async def test_a_refused_event_in_a_batch_fails_the_batch_at_once(bus: Connector) -> None:
    run = new_event_id()
    llm = await bus.open("llm")
    ok, forged = LlmRequested(turn=0, run_id=run), grant(run)
    with pytest.raises(PublishRefused, match=r"grant\.issued"):
        await llm.append_batch([ok, forged])
    assert await stored(bus, run, ok) and not await stored(bus, run, forged)


async def test_no_or_unknown_credentials_are_refused_at_connect(
    secured: tuple[EmbeddedServer, Path],
) -> None:
    server, _ = secured
    assert server.url
    with pytest.raises(AuthenticationFailed, match="authenticate"):
        await connect(server.url, name="anonymous", connect_timeout=3)
    # reported as refused credentials (not retried until a connect timeout)
    with pytest.raises(AuthenticationFailed, match=r"identity 'mallory'.*nats-config"):
        await connect(server.url, nkey_seed=new_seed(), identity="mallory", connect_timeout=3)


async def never_answered(request: Coroutine[Any, Any, object]) -> None:
    """The server drops a refused API request: no answer ever comes."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(request, 0.3)


async def test_only_admin_manages_streams(bus: Connector, caplog: pytest.LogCaptureFixture) -> None:
    cfg = bus.cfg
    admin = await bus.open(ADMIN)
    await (await bus.open("cli")).append(TaskSubmitted(text="keep me", run_id=new_event_id()))
    before = await admin.stream_last_seq()
    for identity in ("llm", "cli", "projector"):
        js = (await bus.open(identity)).js
        await never_answered(js.delete_stream(cfg.log_stream))
        await never_answered(js.purge_stream(cfg.ephemeral_stream))
        await never_answered(js.delete_msg(cfg.log_stream, before))
        await never_answered(js.add_stream(name=f"EVIL_{identity}", subjects=[f"evil{identity}.>"]))
        await never_answered(js.update_stream(StreamConfig(name=cfg.log_stream, deny_purge=False)))
    refusals = re.findall(
        r'refused: nats: permissions violation for publish to "(\S+)"', caplog.text
    )
    assert len(refusals) == 15 and all(s.startswith("$js.api.stream.") for s in refusals)
    info = await admin.js.stream_info(cfg.log_stream)
    assert info.state.last_seq == before and info.state.messages == before
    assert info.config.deny_purge
    assert not [s for s in await admin.js.streams_info() if s.config.name.startswith("EVIL")]


async def test_every_identity_reads_with_gets_and_consumers(bus: Connector) -> None:
    run = new_event_id()
    cli = await bus.open("cli")
    task = await cli.append(TaskSubmitted(text="read me", run_id=run))
    for identity in ("cli", "projector", "llm"):
        log = await bus.open(identity)
        assert (await log.get(task.seq)).subject == task.subject  # direct get
        msg = await log.js.get_msg(bus.cfg.log_stream, task.seq)  # $JS.API.STREAM.MSG.GET
        assert msg.subject == task.subject
        assert await log.last_seq(log.subjects.run(run)) == task.seq
        (raw,) = await DirectReader(log.nc, bus.cfg.log_stream).after(log.subjects.run(run), 0)
        assert raw.seq == task.seq
        assert [s.seq for s in await read_run(log, run)] == [task.seq]  # ordered consumer
        await log.js.consumers_info(bus.cfg.log_stream)


async def test_projector_replays_and_rebuilds_a_projection(
    bus: Connector, sqlite_engine: AsyncEngine
) -> None:
    run = new_event_id()
    await (await bus.open("cli")).append(TaskSubmitted(text="project me", run_id=run))
    projector = await bus.open("projector")
    seen = [s async for s in read(projector, projector.subjects.log_all)]
    assert seen and seen[-1].event is not None and seen[-1].event.run_id == run
    timeline = next(p for p in all_projections() if p.name == "run_timeline")
    p = Projector(projector, sqlite_engine, timeline)
    assert await p.rebuild() > 0
    assert await p.checkpoint() == seen[-1].seq
    assert await p.behind() == 0


async def test_only_the_executor_writes_artifacts_and_anyone_reads_them(bus: Connector) -> None:
    data = b"big tool output " * 2000
    ref = await JetStreamArtifacts(await bus.open("executor")).put("out.txt", data)
    again = await JetStreamArtifacts(await bus.open("executor")).put("out.txt", data)
    assert again.key == ref.key, "content-addressed: stored once"
    assert await JetStreamArtifacts(await bus.open("projector")).get(ref) == data


class ForgingReactor:
    """Plays the LLM handler but reacts with a grant: the broker must stop it."""

    name = "llm"
    consumes = (TaskSubmitted,)

    async def handle(self, event: Event, delivery: object) -> list[Event]:
        return [grant(event.run_id or "")]


async def test_a_reaction_the_broker_refuses_is_dead_lettered(bus: Connector) -> None:
    llm = await bus.open("llm")
    runtime = HandlerRuntime(llm, ForgingReactor(), options=FAST)
    await runtime.ensure_consumer()
    task = asyncio.create_task(runtime.run())
    run = new_event_id()
    try:
        submitted = await (await bus.open("cli")).append(TaskSubmitted(text="x", run_id=run))
        admin = await bus.open(ADMIN)
        dead = admin.subjects.of_type("bus.dead_lettered")

        async def dead_letters() -> list[BusDeadLettered]:
            return [s.event async for s in read(admin, dead)]  # type: ignore[misc]

        letters = await eventually(dead_letters, timeout=30)
    finally:
        runtime.stop()
        await task
    (letter,) = letters
    assert letter.handler == "llm" and letter.stream_seq == submitted.seq
    assert "refused" in letter.reason and "grant.issued" in letter.reason
    assert not [s for s in await read_run(admin, run) if isinstance(s.event, GrantIssued)]


SPAWN = """
scripts:
  - name: child
    match: "^find where"
    turns:
      - tool_calls: [{name: grep, input: {pattern: "def greet"}}]
      - text: "greet is defined in greet.py"
  - name: parent
    turns:
      - tool_calls:
          - {name: read, input: {path: "greet.py"}}
          - {name: spawn, input: {task: "find where greet is defined", tools: [grep, read]}}
      - text: "done: greet.py"
"""


async def test_an_agent_run_completes_with_one_identity_per_handler(
    bus: Connector, secured: tuple[EmbeddedServer, Path], tmp_path: Path, sqlite_engine: AsyncEngine
) -> None:
    server, home = secured
    workspace = demo.make_workspace(tmp_path / "ws")
    settings = Settings(
        home=home, nats_url=server.url, db_url="sqlite+aiosqlite://", traces="none",
        sync="default", provider="scripted", script=demo.SCRIPT, user_skills=tmp_path / "skills",
    )  # fmt: skip
    logs = await bus.open_all(RUNTIME_IDENTITIES)
    cli = await bus.open("cli")
    reactors = build_reactors(
        cli, sqlite_engine, settings, default_workspace=workspace,
        provider=ScriptedProvider.from_text(SPAWN), log_for=logs,
    )  # fmt: skip
    assert {r.name: r.log for r in reactors} == {n: logs(n) for n in ("orchestrator", "policy",
                                                                      "executor", "llm", "capgen",
                                                                      "guardrails", "router",
                                                                      "reloader", "pyagent",
                                                                      "telemetry")}  # type: ignore[attr-defined]  # fmt: skip
    host = Host(cli, sqlite_engine, reactors, options=FAST, log_for=logs)
    await host.start()
    try:
        assert {rt.durable: rt.log for rt in host.runtimes} == {
            r.name: logs(r.name) for r in reactors
        }
        # the projectors' worker connects on its own, as the projector identity
        assert host.worker is not None and host.projectors
        assert host.worker.bus == BusSpec.of(logs("projector"), "projector")
        run = new_event_id()
        task = TaskSubmitted(
            text="look at greet", run_id=run, task_id=run, workspace=str(workspace),
            session_id=new_event_id(),
        )  # fmt: skip
        await cli.append(task)

        async def finished() -> None:
            async for s in read(cli, cli.subjects.run(run), follow=True):
                if isinstance(s.event, RunCompleted | RunFailed):
                    return

        await asyncio.wait_for(finished(), 30)
    finally:
        await host.stop(drain_s=5)
    events = [s.event for s in await read_run(cli, run) if s.event is not None]
    (done,) = [e for e in events if isinstance(e, RunCompleted)]
    assert done.reply == "done: greet.py"
    assert {e.tool for e in events if isinstance(e, ToolCompleted)} == {"read", "spawn"}
    (spawned,) = [e for e in events if isinstance(e, SubagentSpawned)]
    child = [s.event for s in await read_run(cli, spawned.child_run_id) if s.event is not None]
    assert any(isinstance(e, ToolCompleted) and e.tool == "grep" for e in child)
    everything = [*events, *child]
    assert not [e for e in everything if e.type.startswith("bus.")], "nothing dead-lettered"
    assert {e.source for e in everything if e.type.startswith("grant.")} == {"policy"}
    # the bundled guardrails chain checked the task, tool output, calls and the reply, as its
    # own identity, and the run waited for each verdict
    checked = [e for e in everything if e.type == "guardrail.checked"]
    assert {e.source for e in checked} == {"guardrails"}
    assert {e.checkpoint for e in checked} == {"task_input", "tool_output", "tool_call", "reply"}  # type: ignore[attr-defined]
    assert "permissions violation" not in server.log_file.read_text().lower(), (
        "the agent loop needs nothing its identities may not publish"
    )


# --- embedded mode through the CLI's session ------------------------------------------------


async def test_bus_session_starts_the_embedded_server_with_permissions(tmp_path: Path) -> None:
    cfg = BusConfig(data_dir=tmp_path / "home", root="emb", append_timeout_s=3.0)
    run = new_event_id()
    async with bus_connector(cfg) as session:
        assert session.server is not None and session.server.owned
        assert (tmp_path / "home" / "keys" / "policy.nk").exists()
        await session.log.append(TaskSubmitted(text="as cli", run_id=run))
        with pytest.raises(PublishRefused, match="'cli'"):
            await session.log.append(grant(run))
        with pytest.raises(BusError, match="no connection as 'llm'"):
            session.connector.log_for("llm")
        async with bus_session(cfg, identity=APPROVER) as (approver, server):
            assert server is not None and not server.owned, "the running server is reused"
            await approver.append(answer(run))
        admin = await session.open(ADMIN)
        types = [s.event.type for s in await read_run(admin, run) if s.event is not None]
        assert types == ["task.submitted", "approval.granted"]


async def test_on_an_external_server_only_distributed_seeds_are_used(
    bus: Connector, secured: tuple[EmbeddedServer, Path], tmp_path: Path
) -> None:
    server, home = secured
    assert server.url
    laptop = KeyRing(tmp_path / "laptop" / "keys")  # a person's machine: the cli seed only
    laptop.dir.mkdir(parents=True, mode=0o700)
    seed = laptop.seed_path("cli")
    seed.write_bytes(KeyRing(home / "keys").seed("cli"))
    seed.chmod(0o600)
    cfg = BusConfig(url=server.url, data_dir=tmp_path / "laptop", root=ROOT, auth=True)
    run = new_event_id()
    async with bus_connector(cfg) as session:
        assert session.server is None
        await session.log.append(TaskSubmitted(text="from the laptop", run_id=run))
        with pytest.raises(BusError, match=r"no nkey seed for identity 'approver'.*approver\.nk"):
            await session.open(APPROVER)
    assert sorted(p.name for p in laptop.dir.iterdir()) == ["cli.nk"], "no seed was invented"
    elsewhere = cfg.model_copy(update={"root": "unset"})
    with pytest.raises(BusError, match=r"UNSET_LOG does not exist.*admin\.nk"):
        async with bus_session(elsewhere):
            pass


def test_a_server_without_permissions_is_not_reused_and_says_how_to_stop_it(
    tmp_path: Path,
) -> None:
    plain = EmbeddedServer(tmp_path, port=free_port())
    plain.start()
    try:
        keys = KeyRing(tmp_path / "keys")
        block = auth_config({n: keys.public_key(n) for n in IDENTITIES}, BusConfig())
        with pytest.raises(ServerStartError, match="without broker permissions") as refused:
            EmbeddedServer(tmp_path, authorization=block).start()
        assert f"kill {plain.pid}" in str(refused.value)
        assert "NANOCRAB_NATS_AUTH=none" in str(refused.value)
        assert plain.running() is not None, "the other process's server is left alone"
        with pytest.raises(ServerStartError, match="without broker permissions"):
            asyncio.run(_open_session(BusConfig(data_dir=tmp_path)))
        reused = EmbeddedServer(tmp_path)  # asking for no permissions: reusable as before
        assert reused.start() == plain.url and not reused.owned
    finally:
        plain.stop()
    secured = EmbeddedServer(tmp_path, port=free_port(), authorization=block)
    secured.start()
    try:
        with pytest.raises(ServerStartError, match="enforces broker permissions"):
            EmbeddedServer(tmp_path).start()
        other = auth_config({n: KeyRing(tmp_path / "k2").public_key(n) for n in IDENTITIES},
                            BusConfig())  # fmt: skip
        with pytest.raises(ServerStartError, match="other broker permissions"):
            EmbeddedServer(tmp_path, authorization=other).start()
    finally:
        secured.stop()


async def _open_session(cfg: BusConfig) -> None:
    async with bus_session(cfg):
        pass


async def test_an_identity_uses_its_own_durable_and_no_other(
    bus: Connector, caplog: pytest.LogCaptureFixture
) -> None:
    """A compromised identity must not pull and acknowledge another handler's deliveries (an
    acknowledged delivery is never redelivered) nor change its filter (the handler would stall,
    silently): both were reproduced as ``llm`` against the executor's and the policy's durables
    before consumers were limited to one's own."""
    cfg = bus.cfg
    admin = await bus.open(ADMIN)
    stream = cfg.log_stream
    await admin.js.add_consumer(stream, ConsumerConfig(durable_name="executor",
                                                       filter_subject=f"{cfg.root}.>"))  # fmt: skip
    await (await bus.open("cli")).append(TaskSubmitted(text="x", run_id=new_event_id()))
    llm = await bus.open("llm")
    await never_answered(llm.js.add_consumer(
        stream, ConsumerConfig(durable_name="executor", filter_subject="nothing.>")))  # fmt: skip
    await never_answered(llm.js.delete_consumer(stream, "executor"))
    sub = await llm.js.pull_subscribe_bind("executor", stream=stream)
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(1, timeout=1)
    info = await admin.js.consumer_info(stream, "executor")
    assert info.config.filter_subject == f"{cfg.root}.>" and info.num_pending >= 1
    own = await llm.js.add_consumer(stream, ConsumerConfig(durable_name="llm",
                                                           filter_subject=f"{cfg.root}.>"))  # fmt: skip
    assert own.name == "llm"
    (msg,) = await (await llm.js.pull_subscribe_bind("llm", stream=stream)).fetch(1, timeout=5)
    await msg.ack()


class Recorder:
    """Plays the executor and keeps the tasks it was delivered."""

    name = "executor"
    consumes = (TaskSubmitted,)

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def handle(self, event: Event, delivery: object) -> list[Event]:
        self.seen.append(event.text if isinstance(event, TaskSubmitted) else "")
        return []


async def test_a_durable_changed_through_the_unnamed_create_is_put_back(bus: Connector) -> None:
    """A fifth adversarial pass, as an observer and as ``llm``: the subject for server-named
    consumers (which ordered feeds need) with another handler's durable named in the body
    updates that durable — its filter set to nothing, the handler stalled. Subject permissions
    cannot refuse it (the name is not in the subject; docs/security.md). The runtime's guard
    puts the configuration back, and the task stored while it was changed is delivered."""
    executor = await bus.open("executor")
    reactor = Recorder()
    runtime = HandlerRuntime(executor, reactor, options=dataclasses.replace(
        FAST, durable_check_s=3600))  # fmt: skip  (checked by hand below)
    await runtime.ensure_consumer()
    running = asyncio.create_task(runtime.run())
    cli = await bus.open("cli")
    stream = bus.cfg.log_stream
    try:
        await cli.append(TaskSubmitted(text="before", run_id=new_event_id()))
        await eventually(lambda: reactor.seen == ["before"])
        llm = await bus.open("llm")
        body = {"stream_name": stream, "config": {
            "name": "executor", "ack_policy": "explicit", "filter_subject": "nanocrab.nothing"}}
        reply = await llm.nc.request(f"$JS.API.CONSUMER.CREATE.{stream}",
                                     json.dumps(body).encode(), timeout=5)  # fmt: skip
        assert b'"name":"executor"' in reply.data, "the server let it through (the gap)"
        await cli.append(TaskSubmitted(text="during", run_id=new_event_id()))
        assert runtime.guard is not None
        changed = await eventually(runtime.guard.check)
        assert any(c.startswith("filter:") for c in changed) and runtime.guard.repaired == 1
        await eventually(lambda: reactor.seen == ["before", "during"])
        assert await runtime.guard.check() == [], "as the runtime made it"
    finally:
        runtime.stop()
        await running
