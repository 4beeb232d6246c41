"""``nanocrab audit`` and ``nanocrab approvals`` as a user runs them, on a seeded log.

The log lives on a server of this module's own (``NANOCRAB_NATS_URL``), so the CLI reads
exactly the events seeded here; the projection goes to SQLite in the data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from nanocrab.bus import BusConfig, EmbeddedServer, EventLog, connect
from nanocrab.bus.server import free_port
from nanocrab.events import (
    ApprovalRequested,
    Capability,
    Event,
    GrantIssued,
    SecurityRejected,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolStarted,
    utcnow,
)

from .test_cli import cli

RUN = "01JAUDITCLITESTRUN00000001"
APPROVAL = "01JAUDITCLITESTAPPROVAL01"
DOCUMENTED_KEYS = {
    "trace_id", "task_id", "run_id", "step_id", "session_id", "call_id", "tool", "arguments",
    "requested_capabilities", "granted_capabilities", "tier", "rule", "grant_id",
    "approval_required", "approval_id", "approval_result", "approver", "start_at", "end_at",
    "requested_at", "status", "error", "revoked", "duration_ms",
}  # fmt: skip


def seed_events() -> list[Event]:
    now = utcnow()
    env = {"run_id": RUN, "task_id": RUN, "session_id": "sess-1", "source": "test"}
    return [
        ToolRequested(call_id="call-read", tool="read", arguments={"path": "notes.txt"}, **env),
        GrantIssued(
            grant_id="grant-read",
            call_id="call-read",
            tool="read",
            capabilities=[Capability(tool="read", resource="/ws/notes.txt")],
            scope="step",
            tier="safe",
            expires_at=now + timedelta(minutes=10),
            **env,
        ),
        ToolStarted(call_id="call-read", tool="read", invocation_id="inv-1", **env),
        ToolCompleted(call_id="call-read", tool="read", content=[TextBlock("hi")], **env),
        ToolRequested(
            call_id="call-exec", tool="exec", arguments={"command": "rm -rf build"}, **env
        ),
        ApprovalRequested(
            approval_id=APPROVAL,
            call_id="call-exec",
            tool="exec",
            arguments={"command": "rm -rf build"},
            tier="unsafe",
            reason="deletes files",
            expires_at=now + timedelta(hours=1),
            options=["once"],
            **env,
        ),
        SecurityRejected(
            rejected_id="01JFORGEDEVENT000000000000",
            rejected_type="grant.issued",
            reason="grant.issued is signed by UEVIL…, which is not a trusted key",
            signer="UEVILKEY",
            **{**env, "source": "executor"},
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
    """A data directory and the environment that points the CLI at the seeded server."""
    base = tmp_path_factory.mktemp("audit-cli")
    server = EmbeddedServer(base / "nats", port=free_port())
    url = server.start()
    home = base / "home"
    asyncio.run(seed(url, home))
    try:
        yield home, {"NANOCRAB_NATS_URL": url}
    finally:
        server.stop()


def test_audit_table_lists_calls_with_their_status(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    result = cli(home, "audit", env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "audit: 2 tool calls" in out
    assert "read" in out and "completed" in out
    assert "exec" in out and "awaiting_approval" in out and "unsafe" in out
    assert RUN[-8:] in out


def test_audit_json_lines_have_the_documented_keys(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    result = cli(home, "audit", "--json", env=env)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["call_id"] for r in rows] == ["call-read", "call-exec"]
    for row in rows:
        assert row.keys() >= DOCUMENTED_KEYS, DOCUMENTED_KEYS - row.keys()
    read, exec_ = rows
    assert read["status"] == "completed" and read["granted_capabilities"][0]["resource"] == (
        "/ws/notes.txt"
    )
    assert read["duration_ms"] is not None and read["trace_id"] and len(read["trace_id"]) == 32
    assert exec_["approval_required"] is True and exec_["approval_result"] == "pending"
    assert exec_["arguments"] == {"command": "rm -rf build"}
    only = cli(home, "audit", "--json", "--tool", "exec", "--since", "1h", env=env)
    assert [json.loads(x)["call_id"] for x in only.stdout.splitlines()] == ["call-exec"]


def test_audit_csv_has_a_header_row(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    result = cli(home, "audit", "--csv", "--status", "completed", env=env)
    assert result.returncode == 0, result.stderr
    header, *rows = list(csv.reader(io.StringIO(result.stdout)))
    assert set(header) >= DOCUMENTED_KEYS
    assert len(rows) == 1
    row = dict(zip(header, rows[0], strict=True))
    assert (row["call_id"], row["tool"], row["status"]) == ("call-read", "read", "completed")


def test_bad_options_exit_2_with_a_message(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    bad = cli(home, "audit", "--since", "yesterday-ish", env=env)
    assert bad.returncode == 2 and "bad --since 'yesterday-ish'" in bad.stderr
    assert "Traceback" not in bad.stderr
    status = cli(home, "audit", "--status", "exploded", env=env)
    assert status.returncode == 2 and "unknown --status 'exploded'" in status.stderr
    both = cli(home, "audit", "--json", "--csv", env=env)
    assert both.returncode == 2


def test_nothing_matched_says_which_filters(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    result = cli(home, "audit", "--run", "no-such-run", "--since", "2h", env=env)
    assert result.returncode == 0, result.stderr
    assert "nothing matched (run=no-such-run, since=2h)" in result.stdout


def test_violations(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    result = cli(home, "audit", "--violations", env=env)
    assert result.returncode == 0, result.stderr
    assert "grant.issued" in result.stdout and "executor" in result.stdout
    lines = cli(home, "audit", "--violations", "--json", env=env).stdout.splitlines()
    (v,) = [json.loads(x) for x in lines]
    assert v["rejected_type"] == "grant.issued" and v["signer"] == "UEVILKEY"


def test_approvals_lists_the_pending_one(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    result = cli(home, "approvals", env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert APPROVAL in out and "exec" in out and "deletes files" in out and "once" in out
    assert "nanocrab approve ID" in out and "nanocrab deny ID --reason" in out
    as_json = cli(home, "approvals", "--json", env=env)
    (row,) = [json.loads(x) for x in as_json.stdout.splitlines()]
    assert row["approval_id"] == APPROVAL and row["status"] == "pending"
    assert 3000 < row["expires_in_s"] <= 3600


def test_rebuilt_audit_reads_the_same(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    before = cli(home, "audit", "--json", env=env).stdout
    rebuild = cli(home, "projections", "rebuild", "audit", env=env)
    assert rebuild.returncode == 0, rebuild.stderr
    assert "audit (7 events)" in rebuild.stdout
    assert cli(home, "audit", "--json", env=env).stdout == before
