"""``nanocrab audit --call`` when the model provider used one call id in two runs.

A provider that numbers its calls per run gives ``call_0`` to the first call of every run: the
audit keeps a row per run, ``--call call_0`` says the id is ambiguous and lists the runs, and
``--call RUN:call_0`` (or ``--run RUN``) names one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from nanocrab.bus import BusConfig, EmbeddedServer, EventLog, connect
from nanocrab.bus.server import free_port
from nanocrab.events import (
    ApprovalRequested,
    Capability,
    Event,
    GrantIssued,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolStarted,
    utcnow,
)

from .test_cli import cli

RUN_A = "01JAUDITCALLIDSRUN0000000A"
RUN_B = "01JAUDITCALLIDSRUN0000000B"
CALL = "call_0"


def seed_events() -> list[Event]:
    now = utcnow()
    a: dict[str, Any] = {"run_id": RUN_A, "task_id": RUN_A, "session_id": "a", "source": "test"}
    b: dict[str, Any] = {"run_id": RUN_B, "task_id": RUN_B, "session_id": "b", "source": "test"}
    return [
        ToolRequested(call_id=CALL, tool="read", arguments={"path": "a.txt"}, **a),
        GrantIssued(
            grant_id=f"grant-{CALL}",
            call_id=CALL,
            tool="read",
            scope="step",
            tier="safe",
            capabilities=[Capability(tool="read", resource="/ws/a.txt")],
            expires_at=now + timedelta(minutes=10),
            **a,
        ),
        ToolStarted(call_id=CALL, tool="read", invocation_id="inv-a", **a),
        ToolCompleted(call_id=CALL, tool="read", content=[TextBlock("a")], **a),
        ToolRequested(call_id=CALL, tool="exec", arguments={"command": "make"}, **b),
        ApprovalRequested(
            approval_id=f"approval-{CALL}",
            call_id=CALL,
            tool="exec",
            arguments={"command": "make"},
            tier="unsafe",
            reason="runs a command",
            expires_at=now + timedelta(hours=1),
            **b,
        ),
    ]


async def seed(url: str, home: Path) -> None:
    nc = await connect(url, name="seed")
    try:
        log = await EventLog.open(nc, BusConfig(url=url, data_dir=home))
        await log.append_batch(seed_events())
    finally:
        with contextlib.suppress(Exception):
            await nc.drain()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    base = tmp_path_factory.mktemp("audit-call-ids")
    server = EmbeddedServer(base / "nats", port=free_port())
    url = server.start()
    home = base / "home"
    asyncio.run(seed(url, home))
    try:
        yield home, {"NANOCRAB_NATS_URL": url}
    finally:
        server.stop()


def test_each_run_keeps_its_own_row(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    result = cli(home, "audit", "--json", env=env)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["run_id"], r["call_id"], r["tool"], r["status"]) for r in rows] == [
        (RUN_A, CALL, "read", "completed"), (RUN_B, CALL, "exec", "awaiting_approval"),
    ]  # fmt: skip
    assert rows[0]["grant_id"] == f"grant-{CALL}" and rows[1]["grant_id"] is None
    assert (rows[1]["approval_id"], rows[1]["approval_run_id"]) == (f"approval-{CALL}", RUN_B)
    pending = cli(home, "approvals", "--json", env=env)
    (approval,) = [json.loads(x) for x in pending.stdout.splitlines()]
    assert (approval["run_id"], approval["call_id"]) == (RUN_B, CALL)


def test_an_ambiguous_call_id_lists_its_runs(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    result = cli(home, "audit", "--call", CALL, env=env)
    assert result.returncode == 1
    assert "used in 2 runs" in result.stderr and RUN_A in result.stderr and RUN_B in result.stderr
    assert f"--call RUN:{CALL}" in result.stderr and "Traceback" not in result.stderr


def test_run_colon_call_names_one(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    short = cli(home, "audit", "--call", f"{RUN_B[-8:]}:{CALL}", "--json", env=env)
    assert short.returncode == 0, short.stderr
    (row,) = [json.loads(x) for x in short.stdout.splitlines()]
    assert (row["run_id"], row["tool"], row["status"]) == (RUN_B, "exec", "awaiting_approval")
    by_run = cli(home, "audit", "--call", CALL, "--run", RUN_A, env=env)
    assert by_run.returncode == 0, by_run.stderr
    assert "audit: 1 tool call" in by_run.stdout and "completed" in by_run.stdout
    missing = cli(home, "audit", "--call", f"{RUN_A}:call_9", env=env)
    assert missing.returncode == 1 and "no call" in missing.stderr
