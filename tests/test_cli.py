"""The command line as a user runs it: a fresh data directory, no API key, no server running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NANOCRAB = [sys.executable, "-m", "nanocrab"]


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment: no nanocrab settings or API keys of ours, this data directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NANOCRAB_", "ANTHROPIC_"))}
    env.update({"NANOCRAB_HOME": str(home), "COLUMNS": "160", **extra})
    return env


def background(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*NANOCRAB, *args],
        cwd=home.parent,
        env=user_env(home),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def cli(
    home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NANOCRAB, *args],
        cwd=home.parent,
        env=user_env(home, **(env or {})),
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
    timeline = next(p for p in st["projections"] if p["name"] == "run_timeline")
    assert timeline == {"name": "run_timeline", "position": 4, "behind": 1}, (
        "the finished run was projected before exit; the queued task is not yet"
    )

    replay = cli(home, "replay", info["run_id"], "--json")
    assert replay.returncode == 0, replay.stderr
    (line,) = [json.loads(x) for x in replay.stdout.splitlines()]
    assert line["type"] == "task.submitted" and line["data"]["text"] == "queued while nothing runs"
    assert line["specversion"] == "1.0" and line["seq"] == 5

    rebuild = cli(home, "projections", "rebuild")
    assert rebuild.returncode == 0, rebuild.stderr
    assert "run_timeline (5 events)" in rebuild.stdout

    nothing_dead = cli(home, "dead-letters")
    assert nothing_dead.returncode == 0 and "no dead letters" in nothing_dead.stdout

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


def test_up_serves_published_tasks_and_stops_cleanly_on_ctrl_c(home: Path) -> None:
    import signal
    import time

    up = background(home, "up")
    try:
        assert up.stdout is not None
        banner = up.stdout.readline()
        assert "nanocrab up" in banner, banner + (up.stderr.read() if up.poll() is not None else "")
        published = cli(home, "publish", "served by up", "--json")
        assert published.returncode == 0, published.stderr
        run_id = json.loads(published.stdout)["run_id"]
        deadline = time.monotonic() + 30
        while True:
            replay = cli(home, "replay", run_id, "--json")
            types = [json.loads(x)["type"] for x in replay.stdout.splitlines()]
            if "run.completed" in types or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert types == ["task.submitted", "run.started", "reply.sent", "run.completed"]
        status = json.loads(cli(home, "status", "--json").stdout)
        assert status["runtime_up"] is True
    finally:
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=30)
    assert up.returncode == 0, err
    assert "stopped cleanly" in out
    assert not (home / "runtime.json").exists()
    assert not (home / "nats" / "server.json").exists()


def test_tail_follows_the_log_as_json(home: Path) -> None:
    import time

    assert cli(home, "publish", "first").returncode == 0
    # the first command started and stopped its own server; tail starts one again and follows it
    tail = background(home, "tail", "--all", "--json", "--type", "task.*")
    try:
        assert tail.stdout is not None
        first = json.loads(tail.stdout.readline())
        assert first["type"] == "task.submitted" and first["data"]["text"] == "first"
        time.sleep(0.5)
        assert cli(home, "publish", "second").returncode == 0
        second = json.loads(tail.stdout.readline())
        assert second["data"]["text"] == "second" and second["seq"] == 2
    finally:
        tail.send_signal(__import__("signal").SIGINT)
        tail.communicate(timeout=20)
    assert tail.returncode == 0


def test_an_external_server_is_used_when_configured(home: Path, nats_url: str) -> None:
    result = cli(
        home, "publish", "to the external server", "--json", env={"NANOCRAB_NATS_URL": nats_url}
    )
    assert result.returncode == 0, result.stderr
    assert not (home / "nats").exists(), "no embedded server was started"
