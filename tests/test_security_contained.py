"""What the policy lets through as Safe is contained by the exec sandbox, end to end.

The default policy calls a short list of test commands Safe; the workspace's own files decide
what those commands execute (a test module, a ``conftest.py``, a ``.git/config`` someone planted).
Each case plants such a file, runs the Safe command through the real policy handler, executor and
audit projection with the bundled default policy and no approval, and asserts that the attempt
was contained — the secret not in the output, the outside file untouched, no connection made —
and what the audit row says (Safe, ``shell-readonly``, it ran).
"""

from __future__ import annotations

import asyncio
import socket
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nanocrab.events import ExecDetails, TextBlock, ToolCompleted
from nanocrab.policy import load_policy
from nanocrab.tools.confine import probe
from tests.security_rig import Rig, security_rig

pytestmark = pytest.mark.timeout(90)

SECRET = "s3cr3t-value-9f27"


@dataclass
class Scene:
    rig: Rig
    secret: Path  # a file in a "home" outside the workspace
    seed: Path  # a signing seed in the data directory
    outside: Path  # a file outside the workspace that must stay as it is
    port: int  # a TCP listener on loopback
    unix: Path  # a Unix socket outside the workspace
    connections: list[str]


@pytest.fixture
async def scene(  # type: ignore[no-untyped-def]
    log, sqlite_engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Scene]:
    status = probe()
    assert status.available, f"this machine class supports the exec sandbox: {status}"
    home = tmp_path / "home"
    home.mkdir()
    secret = home / "secret.txt"
    secret.write_text(SECRET)
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    connections: list[str] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append("tcp")
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    unix = tmp_path / "agent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(unix))
    listener.listen()
    try:
        async with security_rig(log, sqlite_engine, tmp_path, load_policy(None)) as rig:
            seed = tmp_path / "keys" / "policy.nk"
            rig.keys.keypair("policy")
            assert seed.exists()
            await git("init", "-q", str(rig.workspace))
            yield Scene(rig, secret, seed, outside, port, unix, connections)
    finally:
        server.close()
        listener.close()


async def git(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec("git", *args)
    assert await proc.wait() == 0


def plant_test(scene: Scene, attempt: str) -> None:
    """A test module whose one test runs ``attempt`` and prints ESCAPED if it worked."""
    body = textwrap.indent(textwrap.dedent(attempt).strip(), " " * 12)
    code = (
        "import os, socket, subprocess, sys, unittest\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_attempt(self):\n"
        "        try:\n"
        f"{body}\n"
        "        except Exception as exc:\n"
        "            print('CONTAINED', type(exc).__name__, flush=True)\n"
        "        else:\n"
        "            print('ESCAPED', flush=True)\n"
    )
    (scene.rig.workspace / "test_attempt.py").write_text(code)


async def run_safe(scene: Scene, command: str) -> tuple[ToolCompleted, str]:
    rig = scene.rig
    run = await rig.start_run()
    call = await rig.call(run, "exec", {"command": command})
    outcome = await rig.outcome(run, call)
    assert isinstance(outcome, ToolCompleted), outcome
    text = "".join(b.text for b in outcome.content if isinstance(b, TextBlock))
    assert isinstance(outcome.details, ExecDetails) and outcome.details.confined, text
    row = await rig.audit(call, lambda r: r.status in ("completed", "failed"))
    assert (row.tier, row.rule, row.approval_required) == ("safe", "shell-readonly", False)
    assert row.start_at is not None and row.grant_id is not None
    assert SECRET not in text, "the secret reached the model"
    assert scene.outside.read_text() == "untouched"
    assert not scene.connections
    return outcome, text


def contained(text: str) -> None:
    assert "ESCAPED" not in text and "CONTAINED" in text, text


ATTEMPTS = {
    "read a file in a home": "print(open({secret!r}).read())",
    "read a signing seed": "print(open({seed!r}).read())",
    "read the runtime's environment": "print(open('/proc/1/environ').read())",
    "read its own environ file": "print(open('/proc/self/environ').read())",
    "find a key in the environment": "assert 'ANTHROPIC_API_KEY' in os.environ, 'absent'",
    "write outside the workspace": "open({outside!r}, 'w').write('pwned')",
    "plant a git hook": "open('.git/hooks/pre-commit', 'w').write('#!/bin/sh\\necho pwned')",
    "rewrite .git/config": "open('.git/config', 'a').write('[core]\\n\\tfsmonitor = evil\\n')",
    "connect to a local port": "socket.create_connection(('127.0.0.1', {port}), timeout=2)",
    "connect to a unix socket": ("s = socket.socket(socket.AF_UNIX)\ns.connect({unix!r})"),
    "spawn a shell that reads the secret": (
        "out = subprocess.run(['cat', {secret!r}], capture_output=True, text=True)\n"
        "assert out.returncode == 0, out.stderr\nprint(out.stdout)"
    ),
    "symlink out and read through it": (
        "os.symlink({secret!r}, 'peek')\nprint(open('peek').read())"
    ),
    "list another home": "print(os.listdir({home!r}))",
}


@pytest.mark.parametrize("attempt", sorted(ATTEMPTS))
async def test_a_test_module_is_contained(scene: Scene, attempt: str) -> None:
    code = ATTEMPTS[attempt].format(
        secret=str(scene.secret), seed=str(scene.seed), outside=str(scene.outside),
        port=scene.port, unix=str(scene.unix), home=str(scene.secret.parent),
    )  # fmt: skip
    plant_test(scene, code)
    _, text = await run_safe(scene, "python3 -m unittest -q test_attempt")
    contained(text)
    assert not (scene.rig.workspace / ".git" / "hooks" / "pre-commit").exists()
    assert "fsmonitor" not in (scene.rig.workspace / ".git" / "config").read_text()


async def test_a_conftest_run_by_pytest_is_contained(scene: Scene) -> None:
    (scene.rig.workspace / "conftest.py").write_text(
        textwrap.dedent(
            f"""
            try:
                print(open({str(scene.secret)!r}).read())
                open({str(scene.outside)!r}, "w").write("pwned")
            except Exception as exc:
                print("CONTAINED", type(exc).__name__)
            else:
                print("ESCAPED")
            """
        )
    )
    (scene.rig.workspace / "test_plain.py").write_text("def test_ok():\n    assert True\n")
    _, text = await run_safe(scene, "python3 -m pytest -q -s -p no:cacheprovider")
    contained(text)


async def test_a_planted_fsmonitor_runs_confined_under_git_status(scene: Scene) -> None:
    """A ``.git/config`` the workspace came with (``core.fsmonitor`` runs on every
    ``git status``): the hook runs inside the sandbox, so it reaches nothing outside."""
    hook = scene.rig.workspace / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch ran\ncat {scene.secret} > {scene.outside}\nexit 0\n")
    hook.chmod(0o755)
    await git("-C", str(scene.rig.workspace), "config", "core.fsmonitor", str(hook))
    await run_safe(scene, "git status")
    assert (scene.rig.workspace / "ran").exists(), "git ran the planted hook (confined)"
    assert scene.outside.read_text() == "untouched"
