"""The command line as a user runs it: a fresh data directory, no API key, no server running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NANOCRAB = [sys.executable, "-m", "nanocrab"]


def cli(
    home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NANOCRAB_", "ANTHROPIC_"))}
    base.update({"NANOCRAB_HOME": str(home), "COLUMNS": "160", **(env or {})})
    return subprocess.run(
        [*NANOCRAB, *args],
        cwd=home.parent,
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_run_publish_replay_status_rebuild_from_a_fresh_data_dir(home: Path) -> None:
    done = cli(home, "run", "hello crab")
    assert done.returncode == 0, done.stderr
    assert "answer: echo: hello crab" in done.stdout
    assert "run.completed" in done.stdout
    assert not (home / "nats" / "server.json").exists(), "the embedded server was stopped"
    assert (home / "traces.jsonl").stat().st_size > 0, "spans were exported"

    published = cli(home, "publish", "queued while nothing runs", "--json")
    assert published.returncode == 0, published.stderr
    info = json.loads(published.stdout)
    assert info["seq"] == 5 and not info["duplicate"]

    status = cli(home, "status", "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    log_stream = next(s for s in st["streams"] if s["name"] == "NANOCRAB_LOG")
    assert log_stream["messages"] == 5
    echo = next(c for c in st["consumers"] if c["name"] == "echo")
    assert echo["pending"] == 1, "the queued task waits for a handler"
    assert st["dead_letters"] == 0 and st["runtime_up"] is False

    replay = cli(home, "replay", info["run_id"], "--json")
    assert replay.returncode == 0, replay.stderr
    (line,) = [json.loads(x) for x in replay.stdout.splitlines()]
    assert line["type"] == "task.submitted" and line["data"]["text"] == "queued while nothing runs"
    assert line["specversion"] == "1.0" and line["seq"] == 5

    rebuild = cli(home, "projections", "rebuild")
    assert rebuild.returncode == 0, rebuild.stderr
    assert "run_timeline (5 events)" in rebuild.stdout

    missing = cli(home, "replay", "no-such-run")
    assert missing.returncode == 1 and "no events for run" in missing.stderr


def test_unreachable_external_server_is_a_clear_error(home: Path) -> None:
    result = cli(home, "publish", "x", env={"NANOCRAB_NATS_URL": "nats://127.0.0.1:1"}, timeout=60)
    assert result.returncode == 1
    assert "cannot connect to NATS at nats://127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_configuration_is_rejected_with_what_to_fix(home: Path) -> None:
    result = cli(home, "status", env={"NANOCRAB_TRACES": "loud"})
    assert result.returncode == 2
    assert "NANOCRAB_TRACES='loud'" in result.stderr
