"""The ssh operations backend against a real OpenSSH server on loopback (tests/ssh_rig.py).

The remote workspace is a directory of this machine reached only through sshd; the run's
workspace the tools name is another, empty directory, so a file that lands there (rather than
in the remote one) fails the test.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import asyncssh
import psutil
import pytest

from nanocrab.tools import LocalOperations, ToolContext, ToolRegistry, default_tools
from nanocrab.tools.confine import Confinement, SandboxUnavailable
from nanocrab.tools.paths import PathEscape
from nanocrab.tools.ssh import SshOperations, SshTarget
from tests.conftest import eventually
from tests.ssh_rig import Sshd, sshd  # noqa: F401  (the fixture)
from tests.test_tools_support import NoArtifacts, Recorder


def target(server: Sshd, root: Path) -> SshTarget:
    key = asyncssh.read_private_key(server.client_key)
    return SshTarget(
        host=server.host, port=server.port, user=server.user, root=str(root),
        key=lambda: key, known_hosts=server.known_hosts,
    )  # fmt: skip


@pytest.fixture
async def remote(sshd: Sshd, tmp_path: Path) -> Any:  # noqa: F811
    """(ops, remote root, local workspace, outside directory)."""
    root = (tmp_path / "remote").resolve()
    root.mkdir()
    local = (tmp_path / "local").resolve()
    local.mkdir()
    outside = (tmp_path / "outside").resolve()
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    ops = SshOperations(target(sshd, root), kill_grace_s=0.5)
    try:
        yield ops, root, local, outside
    finally:
        await ops.close()


async def test_files_land_in_the_remote_workspace(remote: Any) -> None:
    ops, root, ws, _ = remote
    await ops.write_bytes(ws / "src" / "deep" / "a.txt", b"hello\n", workspace=ws)
    assert (root / "src" / "deep" / "a.txt").read_bytes() == b"hello\n"
    assert list(ws.iterdir()) == []  # nothing on the executor's side
    assert await ops.read_bytes(ws / "src/deep/a.txt", workspace=ws) == b"hello\n"
    await ops.write_bytes(ws / "src/deep/a.txt", b"bye\n", workspace=ws)  # replaced
    assert (root / "src/deep/a.txt").read_bytes() == b"bye\n"
    assert sorted(p.name for p in (root / "src/deep").iterdir()) == ["a.txt"]  # no temp left
    info = await ops.stat(ws / "src/deep/a.txt", workspace=ws)
    assert info is not None and not info.is_dir and info.size == 4
    assert await ops.stat(ws / "missing", workspace=ws) is None
    assert (await ops.stat(ws / "src", workspace=ws)).is_dir  # type: ignore[union-attr]
    with pytest.raises(IsADirectoryError):
        await ops.read_bytes(ws / "src", workspace=ws)
    with pytest.raises(FileNotFoundError):
        await ops.read_bytes(ws / "nope.txt", workspace=ws)


async def test_listing_and_walking(remote: Any) -> None:
    ops, root, ws, outside = remote
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text("x = 1\n")
    (root / "pkg" / "sub" / "n.py").write_text("y = 2\n")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "dep.js").write_text("")
    (root / "inside").symlink_to("pkg")  # a link inside: followed
    (root / "out").symlink_to(outside)  # a link out: neither followed nor entered
    entries = {e.name: e for e in await ops.list_dir(ws, workspace=ws)}
    assert set(entries) == {"pkg", "node_modules", "inside", "out"}
    assert entries["pkg"].is_dir and entries["inside"].is_dir
    assert not entries["out"].is_dir and entries["out"].size == 0
    walked = [(e.rel, e.is_dir, e.is_symlink)
              async for e in ops.walk(ws, workspace=ws, prune={"node_modules"})]  # fmt: skip
    assert walked == [
        ("inside", True, True), ("out", False, True), ("pkg", True, False),
        ("pkg/m.py", False, False), ("pkg/sub", True, False), ("pkg/sub/n.py", False, False),
    ]  # fmt: skip
    local = [(e.rel, e.is_dir, e.is_symlink)
             async for e in LocalOperations().walk(root, workspace=root, prune={"node_modules"})]  # fmt: skip
    assert walked == local  # the same walk as the local backend's over the same tree


async def test_symlink_escapes_are_refused(remote: Any) -> None:
    ops, root, ws, outside = remote
    (root / "out").symlink_to(outside)  # absolute, outside
    (root / "up").symlink_to("../outside")  # relative, climbs out
    (root / "dir").mkdir()
    (root / "dir" / "back").symlink_to("../../remote/dir")  # out and back in: refused too
    (root / "ok").symlink_to(root / "dir")  # absolute, inside: followed
    for path in ("out/secret.txt", "up/secret.txt", "dir/back", "../outside/secret.txt"):
        with pytest.raises(PathEscape):
            await ops.read_bytes(ws / path if not path.startswith("..") else Path(path),
                                 workspace=ws)  # fmt: skip
    with pytest.raises(PathEscape):
        await ops.read_bytes(outside / "secret.txt", workspace=ws)  # not under the workspace
    with pytest.raises(PathEscape):
        await ops.write_bytes(ws / "out" / "planted.txt", b"x", workspace=ws)
    with pytest.raises(PathEscape):
        await ops.write_bytes(ws / "up" / "secret.txt", b"x", workspace=ws)
    with pytest.raises(PathEscape):
        await ops.list_dir(ws / "out", workspace=ws)
    with pytest.raises(PathEscape):
        [e async for e in ops.walk(ws / "up", workspace=ws)]
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"
    await ops.write_bytes(ws / "ok" / "f.txt", b"in\n", workspace=ws)
    assert (root / "dir" / "f.txt").read_bytes() == b"in\n"
    # a symlink at the target, leading out: refused, the file outside untouched
    (root / "victim").symlink_to(outside / "secret.txt")
    with pytest.raises(PathEscape):
        await ops.write_bytes(ws / "victim", b"overwritten", workspace=ws)
    assert (outside / "secret.txt").read_text() == "top secret\n"


def _ctx(ops: Any, ws: Path, **kw: Any) -> ToolContext:
    return ToolContext(workspace=ws, ops=ops, artifacts=NoArtifacts(), timeout_s=20, **kw)


async def test_tools_give_the_same_results_on_both_backends(remote: Any, tmp_path: Path) -> None:
    """Every file tool, run on a tree over ssh and on its twin locally: same content, same
    details (what the audit and the model see)."""
    ops, root, ws, outside = remote
    twin = (tmp_path / "twin").resolve()
    twin.mkdir()
    for base in (root, twin):
        (base / "src").mkdir()
        (base / "src" / "app.py").write_text("def main():\n    return 'TODO: fix'\n")
        (base / "src" / "util.py").write_text("# TODO later\nX = 1\n")
        (base / "README.md").write_text("# demo\n")
        (base / "alias.py").symlink_to("src/util.py")  # inside: listed and searched
        (base / "leak.py").symlink_to(outside / "secret.txt")  # out: left out
        (outside / "secret.txt").write_text("TODO: the secret\n")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("ls", {}),
        ("ls", {"path": "src"}),
        ("read", {"path": "src/app.py"}),
        ("read", {"path": "missing.py"}),
        ("glob", {"pattern": "**/*.py"}),
        ("grep", {"pattern": "TODO"}),
        ("grep", {"pattern": "TODO", "glob": "util*"}),
        ("write", {"path": "notes/new.txt", "content": "one\ntwo\n"}),
        ("edit", {"path": "src/app.py", "old_text": "TODO: fix", "new_text": "fixed"}),
        ("read", {"path": "src/app.py"}),
        ("read", {"path": "../outside/secret.txt"}),
        ("read", {"path": "leak.py"}),
        ("read", {"path": "alias.py"}),
    ]
    registry = ToolRegistry(default_tools())
    for name, args in calls:
        over_ssh = await registry.invoke(name, args, _ctx(ops, ws))
        local = await registry.invoke(name, args, _ctx(LocalOperations(), twin))
        assert over_ssh.is_error == local.is_error, (name, args, over_ssh, local)
        assert over_ssh.error_kind == local.error_kind, (name, args)
        assert over_ssh.details == local.details, (name, args)
        if local.error_kind == "path_escape":
            # refused by the tool's first check locally, by the backend's check (the one that
            # holds) over ssh: the message says which; both say the path leads outside
            assert "outside the workspace" in over_ssh.content[0].text  # type: ignore[union-attr]
            continue
        texts = [b.text.replace(str(ws), "WS") for b in over_ssh.content]  # type: ignore[union-attr]
        twins = [b.text.replace(str(twin), "WS") for b in local.content]  # type: ignore[union-attr]
        assert texts == twins, (name, args)
    assert (root / "notes" / "new.txt").read_text() == "one\ntwo\n"
    assert "fixed" in (root / "src" / "app.py").read_text()
    assert sorted(p.name for p in ws.iterdir()) == []


async def test_exec_runs_in_the_remote_workspace(remote: Any) -> None:
    ops, root, ws, _ = remote
    (root / "data.txt").write_text("remote data\n")
    out = Recorder()
    outcome = await ops.run_process(
        "pwd; cat data.txt; echo oops >&2; exit 3", cwd=ws, timeout_s=20,
        cancel=asyncio.Event(), on_output=out,
    )  # fmt: skip
    assert outcome.exit_code == 3 and not outcome.timed_out and not outcome.aborted
    assert outcome.output.decode().splitlines() == [str(root), "remote data", "oops"]
    assert ("stderr", "oops\n") in out.chunks
    assert "nanocrab-pid" not in out.text
    registry = ToolRegistry(default_tools())
    result = await registry.invoke(
        "exec", {"command": "echo hi > made.txt && ls"}, _ctx(ops, ws, confinement=None)
    )
    # Safe and the backend has no sandbox: refused, nothing ran
    assert result.is_error and result.error_kind == "denied"
    assert not (root / "made.txt").exists()
    approved = Confinement(tier="guarded")
    result = await registry.invoke(
        "exec", {"command": "echo hi > made.txt && ls"}, _ctx(ops, ws, confinement=approved)
    )
    assert not result.is_error, result
    assert (root / "made.txt").read_text() == "hi\n"
    assert result.details.confined is False  # type: ignore[union-attr]
    with pytest.raises(SandboxUnavailable):
        await ops.run_process("true", cwd=ws, timeout_s=5, cancel=asyncio.Event(),
                              on_output=Recorder(), confinement=Confinement())  # fmt: skip


def _running(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


async def test_exec_timeout_and_abort_stop_the_remote_tree(remote: Any) -> None:
    ops, _, ws, _ = remote
    out = Recorder()
    outcome = await ops.run_process(
        "echo started; sleep 61.5 & sleep 61.5", cwd=ws, timeout_s=1.0,
        cancel=asyncio.Event(), on_output=out,
    )  # fmt: skip
    assert outcome.timed_out and outcome.exit_code is None
    assert "started" in out.text

    async def stopped() -> bool:
        return not _running("sleep 61.5")

    await eventually(stopped, timeout=10)
    cancel = asyncio.Event()
    out = Recorder()
    task = asyncio.create_task(
        ops.run_process("echo go; sleep 62.5", cwd=ws, timeout_s=60, cancel=cancel, on_output=out)
    )
    await out.wait_for("go")
    cancel.set()
    outcome = await task
    assert outcome.aborted and outcome.exit_code is None

    async def aborted() -> bool:
        return not _running("sleep 62.5")

    await eventually(aborted, timeout=10)
    # what the command left running in its group when it exited is stopped too
    outcome = await ops.run_process("sleep 63.5 >/dev/null 2>&1 & echo done", cwd=ws,
                                    timeout_s=20, cancel=asyncio.Event(), on_output=Recorder())  # fmt: skip
    assert outcome.exit_code == 0

    async def reaped() -> bool:
        return not _running("sleep 63.5")

    await eventually(reaped, timeout=10)


async def test_the_host_key_must_be_known(sshd: Sshd, tmp_path: Path) -> None:  # noqa: F811
    root = tmp_path / "r"
    root.mkdir()
    other = tmp_path / "known_hosts"
    other.write_text(
        f"[127.0.0.1]:{sshd.port} "
        + asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    )
    key = asyncssh.read_private_key(sshd.client_key)
    ops = SshOperations(SshTarget(host=sshd.host, port=sshd.port, user=sshd.user,
                                  root=str(root), key=lambda: key, known_hosts=other))  # fmt: skip
    with pytest.raises(ConnectionError):
        await ops.stat(tmp_path / "ws" / "x", workspace=tmp_path / "ws")
    await ops.close()
    assert os.listdir(root) == []


# --- end to end: an agent whose backend is the ssh server ---------------------------------

BUILDER_SCRIPT = """
scripts:
  - name: remote
    match: "remote"
    turns:
      - tool_calls:
          - {name: ls, input: {path: "."}}
          - {name: read, input: {path: data.txt}}
          - {name: grep, input: {pattern: "row"}}
      - tool_calls:
          - {name: write, input: {path: out/report.txt, content: "rows: 3\\n"}}
      - tool_calls:
          - {name: edit, input: {path: data.txt, old_text: "three", new_text: "THREE"}}
          - {name: read, input: {path: link/secret.txt}}
          - {name: exec, input: {command: "touch ran-unconfined"}}
      - text: "done remotely"
  - name: local
    turns:
      - tool_calls: [{name: write, input: {path: here.txt, content: "local\\n"}}]
      - text: "done locally"
"""


async def test_an_agent_with_the_ssh_backend_works_in_the_remote_workspace(
    sshd: Sshd,  # noqa: F811
    log: Any,
    sqlite_engine: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nanocrab.agents import DEFAULT, PROFILES
    from nanocrab.backends import backends_setup
    from nanocrab.bus import read_run
    from nanocrab.events import RunCompleted, ToolCompleted, ToolStarted
    from nanocrab.llm import ScriptedProvider
    from nanocrab.projections import AuditProjection, Projector, audit_rows
    from tests.agent_fixtures import agent_reactors, finished, of_type, running_host, submit

    monkeypatch.setitem(PROFILES, "builder", DEFAULT.model_copy(update={"name": "builder"}))
    root = (tmp_path / "remote").resolve()
    root.mkdir()
    (root / "data.txt").write_text("one row\ntwo rows\nthree rows\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("top secret\n")
    (root / "link").symlink_to(tmp_path / "outside")  # on the remote host, leading out
    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    config = tmp_path / "config"
    config.mkdir()
    (config / "backends.yaml").write_text(
        "version: 1\n"
        "backends:\n"
        "  box:\n"
        f"    type: ssh\n    host: {sshd.host}\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    key: box-key\n    known_hosts: {sshd.known_hosts}\n    workspace: {root}\n"
        "agents:\n  builder: box\n"
    )
    key_text = sshd.client_key.read_text()
    setup = backends_setup(config, {"NANOCRAB_CREDENTIAL_BOX_KEY": key_text})
    assert set(setup.by_agent) == {"builder"} and (config / "backends.yaml") in setup.protected
    provider = ScriptedProvider.from_text(BUILDER_SCRIPT)
    reactors = agent_reactors(log, sqlite_engine, provider, ws, backends=setup.by_agent)
    async with running_host(log, sqlite_engine, reactors):
        task = submit("summarise the remote data", ws, agent="builder")
        await log.append(task)
        events = await finished(log, task.run_id or "")
        local_task = submit("write a local note", ws)
        await log.append(local_task)
        local_events = await finished(log, local_task.run_id or "")

    (done,) = of_type(events, RunCompleted)
    assert done.reply == "done remotely"
    results = {c.tool + str(i): c for i, c in enumerate(of_type(events, ToolCompleted))}
    by_tool: dict[str, list[Any]] = {}
    for c in results.values():
        by_tool.setdefault(c.tool, []).append(c)
    assert "three rows" in by_tool["read"][0].content[0].text
    assert not by_tool["write"][0].is_error and not by_tool["edit"][0].is_error
    assert (by_tool["grep"][0].details.matches, by_tool["grep"][0].details.files) == (3, 1)
    assert by_tool["read"][1].error_kind == "path_escape"
    # Safe exec and a backend without a sandbox: refused, nothing ran remotely
    assert by_tool["exec"][0].error_kind == "denied"
    assert (root / "out" / "report.txt").read_text() == "rows: 3\n"
    assert "THREE rows" in (root / "data.txt").read_text()
    assert not (root / "ran-unconfined").exists()
    assert sorted(p.name for p in ws.iterdir()) == ["here.txt"]  # only the local agent's file
    assert {s.backend for s in of_type(events, ToolStarted)} == {"ssh:box"}
    assert {s.backend for s in of_type(local_events, ToolStarted)} == {None}
    assert (ws / "here.txt").read_text() == "local\n"
    # the key, its credential's name and the remote workspace never reach the log
    stored = [s.raw for s in await read_run(log, task.run_id or "")]
    body = key_text.split("\n")[1]
    assert all(body.encode() not in raw and b"box-key" not in raw for raw in stored)

    projector = Projector(log, sqlite_engine, AuditProjection())
    await projector.catch_up()
    rows = await audit_rows(sqlite_engine, run_id=task.run_id)
    assert sorted((r.tool, r.status, r.backend) for r in rows) == sorted([
        ("ls", "completed", "ssh:box"), ("read", "completed", "ssh:box"),
        ("write", "completed", "ssh:box"), ("grep", "completed", "ssh:box"),
        ("edit", "completed", "ssh:box"), ("read", "failed", "ssh:box"),
        ("exec", "refused", "ssh:box"),
    ])  # fmt: skip
    (local_row,) = await audit_rows(sqlite_engine, run_id=local_task.run_id)
    assert (local_row.tool, local_row.status, local_row.backend) == ("write", "completed", None)
    for backend in setup.by_agent.values():
        await backend.close()


async def test_tool_paths_resolve_on_the_remote_tree(remote: Any) -> None:
    from nanocrab.tools import ToolError

    ops, root, ws, outside = remote
    (root / "real").mkdir()
    (root / "alias").symlink_to("real")
    (root / "out").symlink_to(outside)
    assert await ops.resolve(ws, "alias/new/file.txt") == ws / "real" / "new" / "file.txt"
    assert await ops.resolve(ws, "missing/../alias") == ws / "real"
    assert await ops.resolve(ws, f"{root}/alias") == ws / "real"  # spelled from the remote root
    assert await ops.resolve(ws, str(ws / "x")) == ws / "x"
    for bad in ("out/secret.txt", "..", "real/../../x", "/etc/passwd", f"{root}/../outside"):
        with pytest.raises(ToolError) as refused:
            await ops.resolve(ws, bad)
        assert refused.value.kind == "path_escape", bad


def test_backends_yaml_is_validated(tmp_path: Path) -> None:
    from nanocrab.backends import BackendsError, backends_setup

    config = tmp_path / "backends.yaml"
    ssh = "type: ssh, host: h, user: u, workspace: /w"
    for text, says in [
        (f"version: 1\nbackends: {{box: {{{ssh}, key: k}}}}\nagents: {{coder: other}}\n",
         "names backend 'other'"),
        (f"version: 1\nbackends: {{box: {{{ssh}, key: k, extra: 1}}}}\n", "extra"),
        ("version: 1\nbackends: {box: {type: ssh, host: h, user: u, key: k, workspace: w}}\n",
         "absolute"),
    ]:  # fmt: skip
        config.write_text(text)
        with pytest.raises(BackendsError, match=says) as bad:
            backends_setup(tmp_path, {})
        assert str(config) in str(bad.value)
    assert backends_setup(tmp_path, {"NANOCRAB_BACKENDS": "none"}).by_agent == {}


async def test_an_unreachable_host_fails_the_call(tmp_path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    from tests.ssh_rig import _free_port

    ops = SshOperations(SshTarget(host="127.0.0.1", port=_free_port(), user="nobody",
                                  root="/srv/ws", key=lambda: key))  # fmt: skip
    ws = tmp_path / "ws"
    result = await ToolRegistry(default_tools()).invoke("read", {"path": "a.txt"}, _ctx(ops, ws))
    assert result.is_error and result.error_kind == "unavailable"
    assert "127.0.0.1" in result.content[0].text  # type: ignore[union-attr]
    result = await ToolRegistry(default_tools()).invoke(
        "exec", {"command": "true"}, _ctx(ops, ws, confinement=Confinement(tier="guarded"))
    )
    assert result.is_error and result.error_kind == "failed"


async def test_more_commands_at_once_than_the_server_has_sessions(remote: Any) -> None:
    """sshd allows 10 sessions per connection (MaxSessions); 14 calls at once all run."""
    ops, _, ws, _ = remote

    async def run(i: int) -> bytes:
        outcome = await ops.run_process(f"echo {i}", cwd=ws, timeout_s=30,
                                        cancel=asyncio.Event(), on_output=Recorder())  # fmt: skip
        assert outcome.exit_code == 0
        return outcome.output

    outputs = await asyncio.gather(*(run(i) for i in range(14)))
    assert outputs == [f"{i}\n".encode() for i in range(14)]


async def test_a_channel_the_server_refuses_for_a_moment_is_asked_for_again(remote: Any) -> None:
    """sshd still counts a session that just closed against MaxSessions for a moment (it failed
    the test above once, under load): a refused channel open is tried again, briefly."""
    ops, _, ws, _ = remote
    conn, _ = await ops._connect()
    real = conn.create_session
    refusals = []

    async def refuse_once(*args: Any, **kw: Any) -> Any:
        if not refusals:
            refusals.append(1)
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, "open failed")
        return await real(*args, **kw)

    conn.create_session = refuse_once
    try:
        outcome = await ops.run_process("echo again", cwd=ws, timeout_s=30,
                                        cancel=asyncio.Event(), on_output=Recorder())  # fmt: skip
    finally:
        del conn.create_session
    assert refusals == [1] and outcome.exit_code == 0 and outcome.output == b"again\n"
