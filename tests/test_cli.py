"""The command line as a user runs it: a fresh data directory, no API key, no server running."""

from __future__ import annotations

import json
import os
import signal
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
    done = cli(home, "run", "hello crab", "--workspace", str(home.parent))
    assert done.returncode == 0, done.stderr
    assert "received your task: hello crab" in done.stdout, "the offline model answered"
    assert "run completed" in done.stdout and "usage" in done.stdout
    assert not (home / "nats" / "server.json").exists(), "the embedded server was stopped"
    assert (home / "traces.jsonl").stat().st_size > 0, "spans were exported"

    published = cli(home, "publish", "queued while nothing runs", "--json")
    assert published.returncode == 0, published.stderr
    info = json.loads(published.stdout)
    # 6 events of the run + the bundled guardrails' verdicts on the task and the reply
    assert info["seq"] == 9 and not info["duplicate"]

    status = cli(home, "status", "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    log_stream = next(s for s in st["streams"] if s["name"] == "NANOCRAB_LOG")
    assert log_stream["messages"] == 9
    orchestrator = next(c for c in st["consumers"] if c["name"] == "orchestrator")
    assert orchestrator["pending"] == 1, "the queued task waits for a handler"
    assert st["dead_letters"] == 0 and st["runtime_up"] is False
    timeline = next(p for p in st["projections"] if p["name"] == "run_timeline")
    assert timeline == {
        "name": "run_timeline",
        "position": 8,
        "behind": 1,
        "error": None,
        "attempts": 0,
    }, "the finished run was projected before exit; the queued task is not yet"

    replay = cli(home, "replay", info["run_id"], "--json")
    assert replay.returncode == 0, replay.stderr
    (line,) = [json.loads(x) for x in replay.stdout.splitlines()]
    assert line["type"] == "task.submitted" and line["data"]["text"] == "queued while nothing runs"
    assert line["specversion"] == "1.0" and line["seq"] == 9

    rebuild = cli(home, "projections", "rebuild")
    assert rebuild.returncode == 0, rebuild.stderr
    assert "run_timeline (9 events)" in rebuild.stdout

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
        assert [t for t in types if t != "guardrail.checked"] == [
            "task.submitted", "run.started", "llm.requested", "llm.responded", "reply.sent",
            "run.completed",
        ]  # fmt: skip
        assert types.count("guardrail.checked") == 2  # the bundled chain: the task, the reply
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
    assert cli(home, "publish", "first").returncode == 0
    # the first command started and stopped its own server; tail starts one again and follows it.
    # Started with SIGINT ignored, as a background job of a script is: Ctrl-C must still stop it.
    tail = subprocess.Popen(
        [*NANOCRAB, "tail", "--all", "--json", "--type", "task.*"],
        cwd=home.parent,
        env=user_env(home),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert tail.stdout is not None
        first = json.loads(tail.stdout.readline())
        assert first["type"] == "task.submitted" and first["data"]["text"] == "first"
        assert cli(home, "publish", "second").returncode == 0
        second = json.loads(tail.stdout.readline())
        assert second["data"]["text"] == "second" and second["seq"] == 2
    finally:
        tail.send_signal(signal.SIGINT)
        tail.communicate(timeout=60)
    assert tail.returncode == 0


def test_an_external_server_is_used_when_configured(home: Path, nats_url: str) -> None:
    result = cli(
        home, "publish", "to the external server", "--json", env={"NANOCRAB_NATS_URL": nats_url}
    )
    assert result.returncode == 0, result.stderr
    assert not (home / "nats").exists(), "no embedded server was started"


def test_demo_is_the_main_job(home: Path) -> None:
    result = cli(home, "demo", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for step in ("skill", "ls", "read", "edit", "exec"):
        assert f"✓ {step}" in out, f"{step} did not run: {out}"
    assert "answer:" in out and "Fixed the greeting" in out
    assert "usage" in out and "run " in out, "timeline and usage are printed"
    workspace = Path(out.split("demo workspace: ")[1].split(" ·")[0].strip())
    assert 'f"Hello, {name}!"' in (workspace / "greet.py").read_text()


def test_cancel_and_say_check_the_run_first(home: Path) -> None:
    missing = cli(home, "say", "no-such-run", "hello")
    assert missing.returncode == 1 and "no run 'no-such-run'" in missing.stderr
    done = cli(home, "run", "/help", "--json", "--workspace", str(home.parent))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    run_id = lines[0]["runid"]
    assert any("/new" in x["data"].get("text", "") for x in lines if x["type"] == "reply.sent")
    late = cli(home, "cancel", run_id)
    assert late.returncode == 1 and "already completed" in late.stderr


def test_new_moves_the_cli_to_a_new_session(home: Path) -> None:
    first = cli(home, "run", "/help", "--workspace", str(home.parent))
    assert first.returncode == 0, first.stderr
    before = (home / "session").read_text().strip()
    new = cli(home, "run", "/new", "--workspace", str(home.parent))
    assert new.returncode == 0 and "Started a new session" in new.stdout
    after = (home / "session").read_text().strip()
    assert after and after != before and after in new.stdout


def test_rerun_replays_a_past_run_against_todays_code(home: Path, tmp_path: Path) -> None:
    import re

    from nanocrab import demo as demo_project

    first = cli(home, "demo", timeout=120)
    assert first.returncode == 0, first.stderr
    # the demo approved its edit at the prompt; a rerun has nobody to ask, so this data
    # directory's policy makes workspace edits Safe
    (home / "policy.yaml").write_text(
        "version: 1\n"
        "rules:\n"
        "  - {id: files, tools: [read, ls, edit, write], paths: ['${workspace}'], tier: safe}\n"
        "  - {id: tests, tools: [exec], commands: ['python3 -m unittest*'], tier: safe}\n"
        "  - {id: skills, tools: [skill], tier: safe}\n"
    )
    run_id = re.search(r"run ([0-9A-Z]{26})", first.stdout).group(1)  # type: ignore[union-attr]
    fresh = demo_project.make_workspace(tmp_path / "fresh")
    again = cli(home, "rerun", run_id, "--workspace", str(fresh), timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "5 recorded turns" in again.stdout and "Fixed the greeting" in again.stdout
    assert 'f"Hello, {name}!"' in (fresh / "greet.py").read_text(), "the tools really ran again"
