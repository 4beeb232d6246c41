"""``nanocrab config`` against a real ``nanocrab up``: the reloader wired as users run it."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from .test_cli import background, cli


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def history(home: Path) -> list[dict[str, object]]:
    done = cli(home, "config", "history", "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def wait_for(home: Path, kind: str, count: int, timeout: float = 60) -> list[dict[str, object]]:
    """The ``kind`` rows of the history once there are ``count`` of them."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [r for r in history(home) if r["type"] == kind]
        if len(rows) >= count:
            return rows
        assert time.monotonic() < deadline, f"no {count}th {kind} in {history(home)}"
        time.sleep(0.3)


def skill(home: Path, body: str, description: str = "Says hello.") -> None:
    path = home / "skills" / "hello" / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: hello\ndescription: {description}\n---\n{body}\n")


def test_config_history_diff_rollback_activate_and_replay_under_up(home: Path) -> None:
    home.mkdir(parents=True)
    up = background(home, "up")
    try:
        assert up.stdout is not None
        banner = up.stdout.readline()
        assert "nanocrab up" in banner, banner + (up.stderr.read() if up.poll() is not None else "")
        skill(home, "Say HELLO-ONE.")
        v1 = str(wait_for(home, "reload.activated", 1)[0]["version"])
        skill(home, "Say HELLO-TWO.")
        v2 = str(wait_for(home, "reload.activated", 2)[1]["version"])
        assert v1 != v2

        skill(home, "x", description="[broken")
        (rejected,) = wait_for(home, "reload.rejected", 1)
        assert "skills/hello/SKILL.md:4" in str(rejected["detail"]), rejected
        check = cli(home, "config", "check")
        assert check.returncode == 2 and "skills/hello/SKILL.md:4" in check.stderr

        diff = cli(home, "config", "diff", v1[:10], v2[:10])
        assert diff.returncode == 0, diff.stderr
        assert "-Say HELLO-ONE." in diff.stdout and "+Say HELLO-TWO." in diff.stdout

        back = cli(home, "config", "rollback")
        assert back.returncode == 0, back.stderr
        assert f"rolled back {v2[:12]} → {v1[:12]}" in back.stdout
        again = cli(home, "config", "activate", v2[:10])
        assert again.returncode == 0, again.stderr
        assert f"activated {v2[:12]}" in again.stdout
        unknown = cli(home, "config", "activate", "ffffffffffff")
        assert unknown.returncode == 2 and "unknown" in unknown.stderr

        published = cli(home, "publish", "hello after the reload", "--json")
        run_id = json.loads(published.stdout)["run_id"]
        deadline = time.monotonic() + 30
        while True:
            replay = cli(home, "replay", run_id)
            if "run.completed" in replay.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert f"config {v2[:12]}" in replay.stdout, replay.stdout
    finally:
        up.send_signal(signal.SIGINT)
        _out, err = up.communicate(timeout=30)
    assert up.returncode == 0, err
