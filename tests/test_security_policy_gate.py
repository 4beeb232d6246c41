"""The policy gate end to end: the bundled default policy, no approval given, through the real
policy handler, executor and audit projection (issue 9's adversarial pass and variations).

Each case asserts that the call was refused — ``grant.denied`` naming the rule — or was not Safe
— ``approval.requested`` at tier Unsafe that nobody answers — that it never started, and what
its audit row says (status, tier, rule). The rig's key directory stands for the data directory:
the handler is given it as ``protected``, as ``nanocrab.cli.wiring`` gives it ``<home>``. Rule
by rule edge cases are in test_policy_rules.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nanocrab.events import (
    ApprovalRequested,
    GrantDenied,
    GrantIssued,
    ToolCompleted,
    ToolStarted,
)
from nanocrab.policy import load_policy
from tests.security_rig import Rig, security_rig

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def gate(  # type: ignore[no-untyped-def]
    log, sqlite_engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Rig]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".netrc").write_text("machine api password hunter2")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "file").write_text("untouched")
    monkeypatch.setenv("HOME", str(home))
    async with security_rig(log, sqlite_engine, tmp_path, load_policy(None)) as rig:
        assert rig.handler is not None
        rig.handler.protected = (str(tmp_path / "keys"),)
        rig.keys.keypair("policy")  # the seeds exist on disk, as in a real data directory
        (rig.workspace / "notes.txt").write_text("hello\n")
        (rig.workspace / ".git").mkdir()
        (rig.workspace / "test_ok.py").write_text(
            "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n"
            "        self.assertTrue(True)\n"
        )
        yield rig


def _fill(arguments: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    return {k: v.format(root=tmp_path) if isinstance(v, str) else v for k, v in arguments.items()}


async def _never_started(rig: Rig, run: str, call: str) -> None:
    events = await rig.events(run)
    assert not [e for e in events if isinstance(e, ToolStarted) and e.call_id == call]
    assert not [e for e in events if isinstance(e, GrantIssued) and e.call_id == call]


async def refused(rig: Rig, run: str, call: str, rule: str | None) -> GrantDenied:
    outcome = await rig.outcome(run, call)
    assert isinstance(outcome, GrantDenied), outcome
    assert outcome.rule == rule and outcome.tier == "deny", outcome.reason
    await _never_started(rig, run, call)
    row = await rig.audit(call, lambda r: r.status == "denied" and r.grant_denied)
    assert (row.tier, row.rule, row.grant_denied) == ("deny", rule, True)
    assert not row.granted_capabilities and row.start_at is None
    assert row.error and outcome.reason[:40] in row.error
    return outcome


async def not_safe(rig: Rig, run: str, call: str, rule: str = "shell-other") -> ApprovalRequested:
    request = await rig.approval(run, call)
    assert (request.tier, request.rule) == ("unsafe", rule), request.reason
    await _never_started(rig, run, call)
    row = await rig.audit(call, lambda r: r.status == "awaiting_approval")
    assert (row.tier, row.rule, row.approval_required) == ("unsafe", rule, True)
    assert row.grant_id is None and row.start_at is None and not row.granted_capabilities
    return request


# --- denied outright: host secrets, the data directory, what the policy cannot read ----------


@pytest.mark.parametrize(
    ("tool", "arguments", "rule"),
    [
        ("exec", {"command": "cat {root}/keys/policy.nk"}, "nanocrab-data"),
        ("exec", {"command": "cat ../keys/*.nk"}, "nanocrab-data"),
        ("read", {"path": "{root}/keys/policy.nk"}, "nanocrab-data"),
        ("grep", {"path": "{root}/keys", "pattern": "SU"}, "nanocrab-data"),
        ("ls", {"path": "{root}/keys"}, "nanocrab-data"),
        ("exec", {"command": "cat /proc/self/environ"}, "secrets"),
        ("read", {"path": "/proc/self/environ"}, "secrets"),
        ("exec", {"command": "cat /proc/self/cwd/notes.txt"}, "secrets"),
        ("exec", {"command": "cat ~/.netrc"}, "secrets"),
        ("exec", {"command": "git diff --no-index /etc/passwd notes.txt"}, "secrets"),
        ("exec", {"command": "ls -laR /root"}, "homes"),
        ("exec", {"command": "cat /home/bob/.ssh/id_rsa"}, "homes"),
        ("exec", {"command": "cat ~root/.bashrc"}, "homes"),
        ("exec", {"command": "cat /ro*/.s*"}, "homes"),
        ("exec", {"command": "PYTHONPATH={root}/outside python3 -m pytest"}, None),
        ("exec", {"command": "ls -R .*"}, None),
        ("exec", {"command": "cat ~-/notes.txt"}, None),
    ],
)
async def test_host_secrets_are_denied(
    gate: Rig, tmp_path: Path, tool: str, arguments: dict[str, Any], rule: str | None
) -> None:
    run = await gate.start_run()
    call = await gate.call(run, tool, _fill(arguments, tmp_path))
    await refused(gate, run, call, rule)


# --- not Safe: each needs an approval nobody gives, so nothing runs --------------------------


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("cat {root}/outside/file", "outside the workspace"),
        ("git log -1 --format='import os; os.system(\"id\")' > test_x.py", "redirects output"),
        ("python3 -m unittest test_x", "not a file or package in the workspace"),
        ("git log > .git/config", "redirects output"),
        ("git diff --output={root}/outside/file", "not allowed"),
        ("git diff --out={root}/outside/file", "not allowed"),
        ("git log --output={root}/outside/file", "not allowed"),
        ("pytest --junitxml={root}/outside/file", "not allowed"),
        ("pytest -o cache_dir={root}/outside", "not allowed"),
        ("python3 -m pytest -otmp", "not allowed"),
        ("pytest --basetemp={root}/outside", "not allowed"),
        ("python3 -m unittest discover -s {root}/outside", "outside the workspace"),
        ("pytest --pastebin=all", "not allowed"),
        ("pytest -p pytest_foo", "allows only no:cacheprovider"),
        ("pytest @args.txt", "starts with '@'"),
        ("pytest --rootdir=/", "not allowed"),
        ("python3 -m pytest --import-mode=importlib", "not allowed"),
        ("git -C {root}/outside status", ""),
        ("git diff --ext-diff", "not allowed"),
        ("python3 -m unittest antigravity", "not a file or package in the workspace"),
    ],
)
async def test_bypasses_wait_for_an_approval_and_never_run(
    gate: Rig, tmp_path: Path, command: str, why: str
) -> None:
    run = await gate.start_run()
    call = await gate.call(run, "exec", {"command": command.format(root=tmp_path)})
    request = await not_safe(gate, run, call)
    assert why in request.reason
    assert (tmp_path / "outside" / "file").read_text() == "untouched"
    assert not (gate.workspace / "test_x.py").exists()


@pytest.mark.parametrize("path", [".git/hooks/post-index-change", ".git/config"])
async def test_a_write_into_git_is_unsafe_and_waits(gate: Rig, path: str) -> None:
    run = await gate.start_run()
    call = await gate.call(run, "write", {"path": path, "content": "#!/bin/sh\nid\n"})
    request = await not_safe(gate, run, call, rule="write-workspace")
    assert ".git directory" in request.reason and request.options == ["once"]
    assert not (gate.workspace / path).exists()


# --- what stays Safe ---------------------------------------------------------------------------


async def test_the_workspace_test_run_stays_safe(gate: Rig) -> None:
    run = await gate.start_run()
    call = await gate.call(run, "exec", {"command": "python3 -m unittest -q test_ok"})
    grant = await gate.wait(run, GrantIssued, lambda e: e.call_id == call)
    assert (grant.tier, grant.rule) == ("safe", "shell-readonly")
    await gate.wait(run, ToolCompleted, lambda e: e.call_id == call, timeout=30)
    row = await gate.audit(call, lambda r: r.status == "completed")
    assert (row.tier, row.rule, row.approval_required) == ("safe", "shell-readonly", False)
