"""Observers: read-only identities for outside clients (docs/events.md, docs/security.md).

A dedicated nats-server per test runs with the data dir's authorization block, observers
included, exactly as ``nanocrab up`` renders it.
"""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import AsyncIterator, Coroutine, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from typer.testing import CliRunner

from nanocrab.bus import (
    AuthenticationFailed,
    BusConfig,
    Connector,
    EmbeddedServer,
    EventLog,
    PublishRefused,
    connect,
    read_run,
)
from nanocrab.bus.permissions import ADMIN, check_observer_name, event_subjects, observer_allow
from nanocrab.bus.server import free_port
from nanocrab.cli.host import server_authorization
from nanocrab.cli.observers import create_observer, observer_keys
from nanocrab.events import (
    EVENT_TYPES,
    ApprovalGranted,
    Event,
    GrantIssued,
    RunCancelled,
    TaskSubmitted,
    new_event_id,
    utcnow,
)
from nanocrab.security import KeyRing

ROOT = "obs"


def test_an_observer_may_publish_on_no_event_subject() -> None:
    cfg = BusConfig(root=ROOT)
    allow = observer_allow("dash")
    every_event = set(event_subjects(sorted(EVENT_TYPES), cfg))
    assert not every_event & set(allow)
    assert not [s for s in allow if s.startswith((f"{ROOT}.", f"{ROOT}_eph.", ">", "$O."))]
    assert not [s for s in allow if "STREAM.CREATE" in s or "STREAM.DELETE" in s]
    for reserved in ("orchestrator", "policy", "admin", "observer"):
        with pytest.raises(ValueError, match="built-in identity"):
            check_observer_name(reserved)
    with pytest.raises(ValueError, match="invalid observer name"):
        check_observer_name("a.b")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def server(home: Path) -> Iterator[EmbeddedServer]:
    """The data dir's server with observer ``dash`` (seed kept) in its authorization."""
    keys = KeyRing(home / "keys")
    create_observer(keys.dir, "dash", keep_seed=True)
    block = server_authorization(keys, BusConfig(data_dir=home, root=ROOT))
    embedded = EmbeddedServer(home, port=free_port(), authorization=block)
    embedded.start()
    yield embedded
    embedded.stop()


@pytest.fixture
async def bus(server: EmbeddedServer, home: Path) -> AsyncIterator[Connector]:
    assert server.url
    cfg = BusConfig(url=server.url, data_dir=home, root=ROOT, auth=True, append_timeout_s=3.0)
    connector = Connector(server.url, cfg, seeds=KeyRing(cfg.keys_dir).seed, name="test")
    await connector.setup()
    yield connector
    await connector.close()


async def observer_log(bus: Connector, name: str = "dash") -> EventLog:
    seed = KeyRing(bus.cfg.keys_dir / "observers").seed(name)
    nc = await connect(bus.url, name=f"test/{name}", nkey_seed=seed, identity=name)
    return EventLog(nc, bus.cfg)


async def never_answered(request: Coroutine[Any, Any, object]) -> None:
    """The server drops a refused API request: no answer ever comes."""
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(request, 0.5)


def forged(run_id: str) -> list[Event]:
    return [
        TaskSubmitted(text="not mine to send", run_id=run_id),
        RunCancelled(reason="nope", run_id=run_id),
        ApprovalGranted(approval_id="a1", approver="dash", run_id=run_id),
        GrantIssued(
            grant_id=new_event_id(), call_id="c1", tool="write", capabilities=[], scope="step",
            tier="safe", expires_at=utcnow() + timedelta(minutes=5), run_id=run_id,
        ),
    ]  # fmt: skip


async def test_an_observer_reads_the_log_and_is_refused_every_publish(bus: Connector) -> None:
    run = new_event_id()
    task = await (await bus.open("cli")).append(TaskSubmitted(text="watch me", run_id=run))
    observer = await observer_log(bus)
    try:
        assert [s.seq for s in await read_run(observer, run)] == [task.seq]  # ordered consumer
        assert (await observer.get(task.seq)).subject == task.subject  # direct get
        durable = ConsumerConfig(
            durable_name="dash", name="dash", ack_policy=AckPolicy.EXPLICIT,
            filter_subject=observer.subjects.run(run),
        )  # fmt: skip
        await observer.js.add_consumer(bus.cfg.log_stream, config=durable)
        sub = await observer.js.pull_subscribe_bind("dash", stream=bus.cfg.log_stream)
        (msg,) = await sub.fetch(1, timeout=5)
        assert msg.metadata.sequence.stream == task.seq
        await msg.ack_sync()
        info = await observer.js.consumer_info(bus.cfg.log_stream, "dash")
        assert info.num_ack_pending == 0, "its own acks are allowed"
        for event in forged(run):
            with pytest.raises(PublishRefused) as refused:
                await observer.append(event)
            assert refused.value.identity == "dash" and event.type in str(refused.value)
        admin = await bus.open(ADMIN)
        assert [s.seq for s in await read_run(admin, run)] == [task.seq], "nothing was stored"
    finally:
        await observer.nc.close()


async def test_an_observer_cannot_drain_reconfigure_or_delete_a_handler_consumer(
    bus: Connector,
) -> None:
    admin = await bus.open(ADMIN)
    stream = bus.cfg.log_stream
    handler = ConsumerConfig(
        durable_name="orchestrator", name="orchestrator", ack_policy=AckPolicy.EXPLICIT,
        filter_subject=admin.subjects.log_all,
    )  # fmt: skip
    await admin.js.add_consumer(stream, config=handler)
    await (await bus.open("cli")).append(TaskSubmitted(text="for the handler", run_id="r1"))
    observer = await observer_log(bus)
    try:
        hijack = ConsumerConfig(
            durable_name="orchestrator", name="orchestrator", ack_policy=AckPolicy.NONE,
            filter_subject=f"{ROOT}.nothing.>",
        )  # fmt: skip
        await never_answered(observer.js.add_consumer(stream, config=hijack))
        await never_answered(observer.js.delete_consumer(stream, "orchestrator"))
        with pytest.raises(TimeoutError):
            await observer.nc.request(
                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.orchestrator", b'{"batch": 1}', timeout=0.5
            )
        # a legacy (unnamed-subject) create carrying the handler's name in its body
        body = {"stream_name": stream, "config": {"name": "orchestrator", "ack_policy": "none"}}
        reply = await observer.nc.request(
            f"$JS.API.CONSUMER.CREATE.{stream}", json.dumps(body).encode(), timeout=2
        )
        assert "error" in json.loads(reply.data), reply.data
        info = await admin.js.consumer_info(stream, "orchestrator")
        assert info.config.filter_subject == admin.subjects.log_all
        assert info.config.ack_policy == AckPolicy.EXPLICIT
        assert info.num_pending == 1 and info.num_ack_pending == 0, "nothing was pulled"
    finally:
        await observer.nc.close()


async def test_an_observer_added_to_a_running_server_works_at_once_and_after_a_restart(
    home: Path,
) -> None:
    keys = KeyRing(home / "keys")
    cfg = BusConfig(data_dir=home, root=ROOT)
    first = EmbeddedServer(home, port=free_port(), authorization=server_authorization(keys, cfg))
    first.start()
    try:
        assert first.url
        with pytest.raises(AuthenticationFailed):
            await connect(first.url, nkey_seed=KeyRing(home / "x").seed("late"), identity="late")
        _, seed = create_observer(keys.dir, "late", keep_seed=False)
        assert not (keys.dir / "observers" / "late.nk").exists(), "the seed was handed out only"
        updated = EmbeddedServer(home, authorization=server_authorization(keys, cfg))
        assert await asyncio.to_thread(updated.reload_authorization)
        nc = await connect(first.url, nkey_seed=seed, identity="late", connect_timeout=3)
        await nc.close()
        reused = EmbeddedServer(home, authorization=server_authorization(keys, cfg))
        assert reused.start() == first.url and not reused.owned, "other commands reuse it"
    finally:
        first.stop()
    second = EmbeddedServer(home, port=free_port(), authorization=server_authorization(keys, cfg))
    second.start()
    try:
        assert second.url
        nc = await connect(second.url, nkey_seed=seed, identity="late", connect_timeout=3)
        await nc.close()
    finally:
        second.stop()


def test_security_observer_command_keeps_the_seed_private_and_says_how_to_connect(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nanocrab.cli import app

    monkeypatch.setenv("NANOCRAB_HOME", str(home))
    monkeypatch.delenv("NANOCRAB_NATS_URL", raising=False)
    monkeypatch.delenv("NANOCRAB_NATS_AUTH", raising=False)
    runner = CliRunner()
    made = runner.invoke(app, ["security", "observer", "dash", "--json"])
    assert made.exit_code == 0, made.output
    out = json.loads(made.stdout)
    seed_file = Path(out["seed_file"])
    assert stat.S_IMODE(seed_file.stat().st_mode) == 0o600 and out["seed"] is None
    assert observer_keys(home / "keys") == {"dash": out["public_key"]}
    assert out["server"] == "not running" and out["durable"] == "dash"
    assert f'nkeys_seed="{seed_file}"' in out["connect"]["python"]
    assert "nkeyAuthenticator" in out["connect"]["javascript"]
    assert "NkeyOptionFromSeed" in out["connect"]["go"]
    again = runner.invoke(app, ["security", "observer", "dash"])
    assert again.exit_code == 1 and "exists already" in again.output
    bad = runner.invoke(app, ["security", "observer", "policy"])
    assert bad.exit_code == 2 and "built-in identity" in bad.output
    printed = runner.invoke(app, ["security", "observer", "once", "--print-seed"])
    assert printed.exit_code == 0, printed.output
    assert "shown once" in printed.stdout and not (home / "keys/observers/once.nk").exists()
    config = runner.invoke(app, ["security", "nats-config"])
    assert out["public_key"] in config.stdout and "observer dash" in config.stdout
    status = runner.invoke(app, ["status", "--json"])
    assert status.exit_code == 0, status.output
    server = json.loads(status.stdout)["server"]
    assert server["url"].startswith("nats://127.0.0.1:") and server["auth"] == "nkeys"
    assert server["observers"] == ["dash", "once"] and "only" in server["lifetime"]
    text = runner.invoke(app, ["status"])
    assert "server: nats://127.0.0.1:" in text.stdout and "security observer" in text.stdout
