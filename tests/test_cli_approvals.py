"""Approvals as a user meets them: `nanocrab run` waits for a Guarded write, another terminal
answers with `nanocrab approve` / `nanocrab deny`, and `nanocrab audit` says who allowed what."""

from __future__ import annotations

import json
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_cli import NANOCRAB, cli, user_env

pytestmark = pytest.mark.timeout(180)

SCRIPT = """
scripts:
  - name: writer
    turns:
      - tool_calls: [{name: write, input: {path: notes.txt, content: "approved text"}}]
      - text: "done writing"
"""


def start_run(home: Path, workspace: Path, script: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*NANOCRAB, "run", "write the notes", "--workspace", str(workspace)],
        cwd=home.parent,
        env=user_env(home, NANOCRAB_SCRIPT=str(script)),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def approval_id_from(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """Read the run's stderr until it says how to answer the approval."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            seen += line
            if m := re.search(r"nanocrab approve (\w+)", line):
                return m.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"no approval prompt; stderr so far:\n{seen}")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    home, workspace = tmp_path / "home", tmp_path / "ws"
    workspace.mkdir()
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    return home, workspace, script


def test_a_guarded_write_waits_for_nanocrab_approve(setup: tuple[Path, Path, Path]) -> None:
    home, workspace, script = setup
    run = start_run(home, workspace, script)
    try:
        approval_id = approval_id_from(run)
        assert not (workspace / "notes.txt").exists(), "nothing runs before the approval"
        pending = cli(home, "approvals", "--json")
        assert pending.returncode == 0, pending.stderr
        rows = [json.loads(line) for line in pending.stdout.splitlines() if line.strip()]
        assert [r["approval_id"] for r in rows] == [approval_id]
        assert rows[0]["tool"] == "write" and rows[0]["tier"] == "guarded"
        answered = cli(home, "approve", approval_id[:12])  # a unique prefix is enough
        assert answered.returncode == 0, answered.stdout + answered.stderr
        out, errs = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 0, out + errs
    assert (workspace / "notes.txt").read_text() == "approved text"
    again = cli(home, "approve", approval_id)
    assert again.returncode == 1 and "already granted" in again.stderr
    audit = cli(home, "audit", "--tool", "write", "--json")
    (row,) = [json.loads(line) for line in audit.stdout.splitlines() if line.strip()]
    assert row["status"] == "completed" and row["approval_result"] == "granted"
    assert row["approver"] and row["approval_required"] is True
    # one run, one trace: the task's root span is written, and the person's approval (another
    # process) joins that trace instead of starting one
    spans = [json.loads(line) for line in (home / "traces.jsonl").read_text().splitlines()]
    (root,) = [s for s in spans if s["name"] == "publish task.submitted"]
    assert root["parent_id"] is None
    trace_id = root["context"]["trace_id"]
    (approval,) = [s for s in spans if s["name"] == "publish approval.granted"]
    assert approval["context"]["trace_id"] == trace_id and approval["parent_id"]
    handled = [s for s in spans if s["name"].endswith("approval.granted") and s is not approval]
    assert handled and all(s["context"]["trace_id"] == trace_id for s in handled)


def test_nanocrab_deny_refuses_the_call_and_the_agent_hears_why(
    setup: tuple[Path, Path, Path],
) -> None:
    home, workspace, script = setup
    run = start_run(home, workspace, script)
    try:
        approval_id = approval_id_from(run)
        answered = cli(home, "deny", approval_id, "--reason", "not today")
        assert answered.returncode == 0, answered.stdout + answered.stderr
        out, errs = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 0, out + errs  # the agent answered after the refusal
    assert "not today" in out
    assert not (workspace / "notes.txt").exists()
    audit = cli(home, "audit", "--status", "denied", "--json")
    (row,) = [json.loads(line) for line in audit.stdout.splitlines() if line.strip()]
    assert row["approval_result"] == "denied" and "not today" in row["error"]


def test_answering_an_unknown_approval_says_what_to_do(setup: tuple[Path, Path, Path]) -> None:
    home, _, _ = setup
    result = cli(home, "approve", "NOSUCHAPPROVAL")
    assert result.returncode == 1 and "nanocrab approvals" in result.stderr


def test_nanocrab_run_on_a_terminal_asks_at_once(setup: tuple[Path, Path, Path]) -> None:
    """On a terminal the run prompts; `s` approves the rule for the rest of the session."""
    import os
    import pty

    home, workspace, script = setup
    master, slave = pty.openpty()
    run = subprocess.Popen(
        [*NANOCRAB, "run", "write the notes", "--workspace", str(workspace)],
        cwd=home.parent,
        env=user_env(home, NANOCRAB_SCRIPT=str(script), TERM="dumb"),
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    screen = b""
    answered = False
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the run exited and closed the terminal
                    break
                screen += chunk
                if not answered and b"approve?" in screen:
                    assert b"guarded" in screen and b"write" in screen
                    os.write(master, b"s\n")
                    answered = True
            elif run.poll() is not None:
                break
        run.wait(timeout=30)
    finally:
        run.kill()
        os.close(master)
    text = screen.decode(errors="replace")
    assert answered, text
    assert run.returncode == 0, text
    assert (workspace / "notes.txt").read_text() == "approved text"
    assert "approved by" in text and "for the session" in text


def test_a_policy_file_with_an_object_tag_stops_the_run_with_a_clear_error(
    setup: tuple[Path, Path, Path],
) -> None:
    home, workspace, script = setup
    home.mkdir(parents=True, exist_ok=True)
    (home / "policy.yaml").write_text(
        'version: 1\nrules:\n  - !!python/object/apply:os.system ["touch pwned"]\n'
    )
    result = cli(home, "run", "write the notes", "--workspace", str(workspace),
                 env={"NANOCRAB_SCRIPT": str(script)})  # fmt: skip
    assert result.returncode == 2
    assert "policy error" in result.stderr and "policy.yaml:3" in result.stderr
    assert not (home.parent / "pwned").exists() and not (workspace / "notes.txt").exists()
