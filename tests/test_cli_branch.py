"""``nanocrab branch``, ``/branch`` in ``nanocrab run`` and the tree in ``nanocrab replay``, as a
user runs them: a fresh data directory, the offline model, no server running."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli import cli

pytestmark = pytest.mark.timeout(300)


def run_json(home: Path, text: str) -> list[dict]:  # type: ignore[type-arg]
    done = cli(home, "run", text, "--json", "--workspace", str(home.parent))
    assert done.returncode == 0, done.stderr
    return [json.loads(x) for x in done.stdout.splitlines()]


def test_branch_moves_the_cli_to_the_branch_and_replay_shows_the_tree(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = run_json(home, "hello crab")
    run_id = first[0]["runid"]
    session = (home / "session").read_text().strip()
    reply = next(e for e in first if e["type"] == "reply.sent")

    missing = cli(home, "branch", run_id, "--at", "NOPENOPENOPE")
    assert missing.returncode == 1
    assert f"run {run_id} has no event 'NOPENOPENOPE'" in missing.stderr.replace("\n", "")

    done = cli(home, "branch", run_id[-8:], "--at", reply["id"][-8:], "--json")
    assert done.returncode == 0, done.stderr
    branch = json.loads(done.stdout)
    assert branch["parent_run_id"] == run_id and branch["at_event_id"] == reply["id"]
    assert branch["parent_session_id"] == session and branch["at_type"] == "reply.sent"
    assert (home / "session").read_text().strip() == branch["session_id"]

    on_branch = run_json(home, "and on the branch?")
    assert on_branch[0]["sessionid"] == branch["session_id"]
    child = on_branch[0]["runid"]
    task = on_branch[0]["id"]

    # /branch in `nanocrab run`: forks the CLI's current session (the branch) at its task
    again = cli(home, "run", f"/branch {task}", "--workspace", str(home.parent))
    assert again.returncode == 0, again.stderr
    second = (home / "session").read_text().strip()
    assert second not in (session, branch["session_id"]) and second in again.stdout
    assert f"from run {child} at task.submitted {task}" in again.stdout

    replay = cli(home, "replay", child)
    assert replay.returncode == 0, replay.stderr
    out = replay.stdout
    assert "session tree" in out and f"root session {session}" in out
    assert f"branch {branch['session_id']} ← reply.sent {reply['id']}" in out
    assert f"this run {child}" in out and f"branch {second} ← task.submitted {task}" in out
    parent = cli(home, "replay", run_id)
    assert f"branch {branch['session_id']}" in parent.stdout and child in parent.stdout
