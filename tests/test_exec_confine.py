"""exec's operating-system sandbox, through ExecTool and LocalOperations on a real workspace: each
test shows a command refused or contained (or, for ordinary work, still working) confined.

The containment tests need a host that can confine (Landlock ABI 3+, user namespaces); without
one they are skipped with the probe's reason, and the fail-closed tests show what happens.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec
import pytest

from nanocrab.events import ExecDetails, TextBlock
from nanocrab.policy import Policy, PolicyError, load_policy
from nanocrab.tools import LocalOperations, ToolContext, ToolRegistry, ToolResult, default_tools
from nanocrab.tools.confine import Confinement, Limits, SandboxStatus, landlock, probe, spawner
from nanocrab.tools.confine.env import build_env, secret_like
from tests.test_tools_support import MemoryArtifacts, make_ctx, sleep_marker, sleeping

HOST = probe()
confined_host = pytest.mark.skipif(not HOST.available, reason=f"no sandbox here: {HOST.detail}")
FAST_KILL = LocalOperations(kill_grace_s=0.3, drain_s=0.3)


def text_of(result: ToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


def details(result: ToolResult) -> ExecDetails:
    assert isinstance(result.details, ExecDetails), result
    return result.details


async def exec_(
    workspace: Path,
    command: str,
    confinement: Confinement | None = None,
    *,
    ops: LocalOperations | None = None,
    timeout_s: float = 60,
) -> ToolResult:
    ctx: ToolContext = make_ctx(workspace, ops=ops, confinement=confinement, timeout_s=timeout_s)
    return await ToolRegistry(default_tools()).invoke("exec", {"command": command}, ctx)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace.resolve()


@pytest.fixture
def repo(ws: Path) -> Path:
    """The workspace as a fresh git repository."""
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    return ws


def exists(path: Path | str) -> bool:
    return Path(path).exists()


def names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace, standing in for $HOME and everything else."""
    path = tmp_path / "outside"
    path.mkdir()
    return path.resolve()


# --- reading -------------------------------------------------------------------------------


@confined_host
async def test_a_file_outside_the_workspace_cannot_be_read(ws: Path, outside: Path) -> None:
    (outside / "secret").write_text("s3cret-home-file\n")
    result = await exec_(ws, f"cat {outside}/secret; ls {outside}")
    assert result.is_error and "s3cret" not in text_of(result)
    assert text_of(result).count("Permission denied") == 2
    assert details(result).confined and details(result).unconfined_reason is None


@confined_host
async def test_the_runtime_users_home_cannot_be_read(ws: Path) -> None:
    home = Path.home()
    result = await exec_(ws, f"ls {home}; cat {home}/.profile {home}/.bashrc")
    assert result.is_error
    assert "Permission denied" in text_of(result)
    assert not re.search(r"^\.(profile|bashrc)$", text_of(result), re.M)


@confined_host
async def test_signing_keys_cannot_be_read(ws: Path, outside: Path) -> None:
    keys = outside / "nanocrab" / "keys"
    keys.mkdir(parents=True)
    (keys / "policy.nk").write_text("SUAPOLICYSEED\n")
    result = await exec_(ws, f"cat {keys}/policy.nk")
    assert result.is_error and "SUAPOLICYSEED" not in text_of(result)
    assert "Permission denied" in text_of(result)


@confined_host
async def test_a_data_directory_inside_the_workspace_is_masked(ws: Path) -> None:
    """The data directory (keys, database) under the workspace is covered by an empty,
    read-only mount that the command cannot remove."""
    home = ws / ".nanocrab"
    (home / "keys").mkdir(parents=True)
    (home / "keys" / "policy.nk").write_text("SUAPOLICYSEED\n")
    (home / "nanocrab.db").write_text("history")
    conf = Confinement(protected=(home, home / "keys"))
    command = (
        "ls -A .nanocrab; echo listed; cat .nanocrab/keys/policy.nk; "
        "umount .nanocrab; mv .nanocrab moved && cat moved/keys/policy.nk; "
        "touch .nanocrab/x; echo done"
    )
    result = await exec_(ws, command, conf)
    out = text_of(result)
    assert "SUAPOLICYSEED" not in out and "nanocrab.db" not in out
    assert out.startswith("listed"), out  # the mount is empty
    assert "Read-only file system" in out
    assert (home / "keys" / "policy.nk").read_text() == "SUAPOLICYSEED\n"


@confined_host
async def test_proc_environ_is_unreadable(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-the-runtime")
    command = (
        f"cat /proc/self/environ; cat /proc/1/environ; cat /proc/{os.getpid()}/environ; ls /proc"
    )
    result = await exec_(ws, command)
    assert result.is_error and "sk-ant" not in text_of(result)
    assert text_of(result).count("Permission denied") == 4


# --- writing -------------------------------------------------------------------------------


@confined_host
async def test_writes_outside_the_workspace_fail(repo: Path, outside: Path) -> None:
    ws = repo
    (outside / "victim").write_text("keep me")
    command = (
        f"echo x > {outside}/x; touch {outside}/y; git diff --output={outside}/victim; "
        f"truncate -s 0 {outside}/victim; mkdir {outside}/d; ln -s /etc {outside}/l; "
        f"cp /etc/hostname {outside}/; mv {outside}/victim {ws}/stolen"
    )
    result = await exec_(ws, command)
    assert result.is_error
    assert names(outside) == ["victim"]
    assert (outside / "victim").read_text() == "keep me"
    assert not exists(ws / "stolen")


@confined_host
async def test_metadata_outside_the_workspace_cannot_change(ws: Path, outside: Path) -> None:
    """Landlock does not control chmod, chown, utime: every mount but the workspace's and the
    private temporary directory's is read-only in the sandbox, so the data directory's keys
    cannot be made readable to all, nor a file outside set-user-ID."""
    keys = outside / "keys"
    keys.mkdir(mode=0o700)
    seed = keys / "policy.nk"
    seed.write_text("SUAPOLICYSEED\n")
    seed.chmod(0o600)
    os.utime(seed, (1_000_000_000, 1_000_000_000))
    command = (
        f"chmod 0755 {keys}; chmod 0644 {seed}; chmod 4777 {seed}; touch -d 2001-01-01 {seed}; "
        f"chown $(id -u) {seed}; echo done"
    )
    result = await exec_(ws, command)
    assert "done" in text_of(result) and "Read-only file system" in text_of(result)
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE(seed.stat().st_mode) == 0o600
    assert seed.stat().st_mtime == 1_000_000_000


@confined_host
async def test_no_set_id_file_nor_file_capability_is_made_in_the_workspace(ws: Path) -> None:
    """The workspace's files are the runtime user's (root's, when it runs as root): a
    set-user-ID copy of a program, or one with file capabilities, would give anyone who runs
    it that user's rights outside the sandbox."""
    command = (
        "cp /bin/true t; chmod 4755 t; chmod u+s,g+s t; "
        "python3 -c \"import os; os.open('c', os.O_CREAT | os.O_WRONLY, 0o4755)\"; "
        "python3 -c \"import os; os.setxattr('t', 'security.capability', b'x')\"; "
        "python3 -c \"import os; os.setxattr('t', 'user.x', b'1')\"; echo done"
    )
    result = await exec_(ws, command)
    assert "done" in text_of(result), text_of(result)
    assert stat.S_IMODE((ws / "t").stat().st_mode) & 0o6000 == 0
    assert not (ws / "c").exists()
    assert text_of(result).count("Operation not supported") == 2
    assert os.listxattr(ws / "t") == []
    plain = await exec_(ws, "chmod 0700 t && python3 -c \"open('n', 'w').write('x')\" && ls")
    assert not plain.is_error and stat.S_IMODE((ws / "t").stat().st_mode) == 0o700


@confined_host
async def test_system_v_ipc_of_the_host_is_out_of_reach(ws: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x4E43_0000 | (os.getpid() & 0xFFFF)
    shm = libc.shmget(key, 4096, 0o1000 | 0o600)  # IPC_CREAT
    assert shm >= 0, os.strerror(ctypes.get_errno())
    try:
        probe_ = f"python3 -c 'import ctypes; print(\"id\", ctypes.CDLL(None).shmget({key}, 0, 0))'"
        result = await exec_(ws, probe_)
        assert "id -1" in text_of(result), text_of(result)
    finally:
        libc.shmctl(shm, 0, None)  # IPC_RMID


@confined_host
async def test_a_git_repository_a_call_no_one_approved_creates_is_removed(ws: Path) -> None:
    """With no ``.git`` in the workspace there is nothing to bind read-only: a repository the
    command makes (its configuration would run in the user's next ``git``) is removed after
    the call, and the call's output says so. An approved ``git init`` keeps its repository."""
    made = "mkdir .git && printf '[core]\\n\\tfsmonitor = evil\\n' > .git/config; echo made"
    result = await exec_(ws, made)
    assert "made" in text_of(result) and "was removed" in text_of(result)
    dot_git = ws / ".git"
    assert not dot_git.exists() and not dot_git.is_symlink()
    linked = await exec_(ws, "echo 'gitdir: /tmp' > .git; echo made")
    assert "was removed" in text_of(linked) and not dot_git.exists()
    approved = await exec_(ws, "git init -q && echo made", Confinement(tier="guarded"))
    assert "was removed" not in text_of(approved) and (ws / ".git" / "config").exists()


@confined_host
async def test_writes_inside_the_workspace_and_a_private_tmpdir_work(ws: Path) -> None:
    command = (
        "echo hi > inside.txt && mkdir -p sub/dir && mv inside.txt sub/dir/ && "
        'echo t > "$TMPDIR/t" && cat "$TMPDIR/t" && echo "tmp=$TMPDIR" && echo "home=$HOME"'
    )
    result = await exec_(ws, command)
    assert not result.is_error, text_of(result)
    assert (ws / "sub" / "dir" / "inside.txt").read_text() == "hi\n"
    tmp = re.search(r"tmp=(\S+)", text_of(result))
    assert tmp and re.search(rf"home={re.escape(tmp[1])}$", text_of(result), re.M)
    assert not exists(tmp[1]), "the private temporary directory is removed after the call"


GIT_ATTACKS = (
    "echo '[core] fsmonitor = evil' >> .git/config; "
    "echo evil > .git/hooks/pre-commit; "
    "echo '[core]' > x && mv x .git/config; "
    "mv .git .git-old; rm -rf .git/hooks; "
    "git config core.fsmonitor evil; "
    # commondir moves where git reads config and hooks from, for the main worktree too
    "mkdir -p .cache/g && printf '[core]\\n\\tfsmonitor = evil\\n' > .cache/g/config && "
    "ln -s ../../.git/objects .cache/g/objects; ln -s ../../.git/refs .cache/g/refs; "
    "echo ../.cache/g > .git/commondir; echo x > .git/config.worktree; mkdir .git/worktrees; "
)


@confined_host
async def test_git_metadata_is_read_only_to_a_call_no_one_approved(repo: Path) -> None:
    ws = repo
    before = {p.relative_to(ws): p.read_bytes() for p in (ws / ".git").rglob("*") if p.is_file()}
    result = await exec_(ws, GIT_ATTACKS + "echo fine > .git/description; echo done")
    assert "done" in text_of(result)
    after = {p.relative_to(ws): p.read_bytes() for p in (ws / ".git").rglob("*") if p.is_file()}
    assert after == before, "nothing in .git changed"
    assert not (ws / ".git-old").exists() and not (ws / ".git" / "worktrees").exists()
    status = await asyncio.to_thread(
        subprocess.run, ["git", "status", "--short"], cwd=ws, capture_output=True, text=True
    )
    assert status.returncode == 0 and "evil" not in status.stderr, status.stderr


@confined_host
async def test_an_approved_call_writes_git_but_not_what_steers_it(repo: Path) -> None:
    ws = repo
    (ws / ".git" / "commondir").write_text(".\n")  # present: bound read-only like config
    config = (ws / ".git" / "config").read_text()
    result = await exec_(ws, GIT_ATTACKS + "echo fine > .git/description; echo done",
                         Confinement(tier="guarded"))  # fmt: skip
    assert "done" in text_of(result)
    assert (ws / ".git" / "config").read_text() == config
    assert (ws / ".git" / "commondir").read_text() == ".\n"
    (ws / ".git" / "commondir").unlink()  # absent: one the command creates is removed after it
    again = await exec_(ws, "echo ../.cache/g > .git/commondir; echo done",
                        Confinement(tier="guarded"))  # fmt: skip
    assert ".git/commondir created by this command was removed" in text_of(again)
    assert not (ws / ".git" / "commondir").exists()
    shutil.rmtree(ws / ".git" / "hooks")  # a repository made without hooks (git init --template=)
    planted = await exec_(ws, "mkdir .git/hooks && echo evil > .git/hooks/pre-commit",
                          Confinement(tier="guarded"))  # fmt: skip
    assert ".git/hooks created by this command was removed" in text_of(planted)
    assert not (ws / ".git" / "hooks").exists()
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert (ws / ".git").is_dir() and not (ws / ".git-old").exists()
    assert (ws / ".git" / "description").read_text() == "fine\n"


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "protocol.file.allow=always", "-c", "user.name=t",
                    "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)  # fmt: skip


@confined_host
async def test_a_worktree_or_submodule_pointer_cannot_be_redirected(tmp_path: Path) -> None:
    """A ``.git`` *file* (``gitdir: …``) says where git finds the repository: a linked
    worktree's, and a checked-out submodule's, which a top-level ``git status`` goes into. Each
    is read-only, for approved calls too, and the directories above a submodule's cannot be
    renamed away (a new pointer would take their place)."""
    main = tmp_path / "main"
    main.mkdir()
    lib = tmp_path / "lib"
    lib.mkdir()
    for repo in (main, lib):
        git("init", "-q", cwd=repo)
        (repo / "f.txt").write_text("f\n")
        git("add", "f.txt", cwd=repo)
        git("commit", "-qm", "one", cwd=repo)
    git("submodule", "add", "-q", str(lib), "vendor/lib", cwd=main)
    git("commit", "-qm", "sub", cwd=main)
    git("worktree", "add", "-q", str(tmp_path / "wt"), cwd=main)
    worktree = (tmp_path / "wt").resolve()
    pointers = {p: p.read_text() for p in (worktree / ".git", main / "vendor" / "lib" / ".git")}
    attack = (
        "mkdir -p .evil && echo 'gitdir: .evil' > .git; echo 'gitdir: .evil' > vendor/lib/.git; "
        "mv vendor v2; mv vendor/lib vendor/l2; rm -rf vendor/lib; echo done"
    )
    for workspace in (worktree, main.resolve()):
        for confinement in (Confinement(), Confinement(tier="guarded")):
            result = await exec_(workspace, attack, confinement)
            assert "done" in text_of(result), text_of(result)
    assert {p: p.read_text() for p in pointers} == pointers
    assert not (main / "v2").exists() and not (main / "vendor" / "l2").exists()


@confined_host
async def test_an_approved_call_still_commits_and_protect_git_off_allows_config(
    repo: Path,
) -> None:
    ws = repo
    (ws / "a.txt").write_text("a\n")
    commit = (
        "git add a.txt && git -c user.name=t -c user.email=t@t commit -qm one && git log --oneline"
    )
    refused = await exec_(ws, commit)  # no person approved it: .git is read-only
    assert refused.is_error and "Read-only file system" in text_of(refused), text_of(refused)
    result = await exec_(ws, commit, Confinement(tier="guarded"))
    assert not result.is_error, text_of(result)
    assert "one" in text_of(result)
    opened = await exec_(ws, "git config user.name agent",
                         Confinement(tier="guarded", protect_git=False))  # fmt: skip
    assert not opened.is_error, text_of(opened)
    assert "agent" in (ws / ".git" / "config").read_text()


@confined_host
async def test_the_sandbox_mounts_do_not_leak_into_the_host(repo: Path) -> None:
    ws = repo
    before = mountinfo()
    result = await exec_(ws, "true", Confinement(protected=(ws / ".git" / "hooks",)))
    assert not result.is_error
    assert mountinfo() == before


def mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


# --- network -------------------------------------------------------------------------------


async def _listener() -> tuple[asyncio.Server, int, list[bool]]:
    hits: list[bool] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(True)
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], hits


CONNECT = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=5)'"


@confined_host
async def test_no_network_without_granted_hosts(ws: Path) -> None:
    """TCP is refused by Landlock (ABI 4+) and, under it, by the empty network namespace; UDP,
    which Landlock does not cover, finds no network at all."""
    server, port, hits = await _listener()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    send = (
        "python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        f's.sendto(b"x", ("127.0.0.1", {udp.getsockname()[1]}))\''
    )
    try:
        async with server:
            tcp = await exec_(ws, CONNECT.format(port=port))
        datagram = await exec_(ws, send)
        with pytest.raises(BlockingIOError):
            udp.recv(16)
    finally:
        udp.close()
    assert tcp.is_error and hits == []
    assert re.search(r"Permission denied|Network is unreachable", text_of(tcp))
    assert datagram.is_error and "Network is unreachable" in text_of(datagram)


@confined_host
async def test_granted_hosts_open_only_web_ports(ws: Path) -> None:
    """With hosts the command shares the host's network, but Landlock (ABI 4+) lets TCP connect
    only to ports 80 and 443."""
    if HOST.abi < 4:
        pytest.skip("Landlock ABI < 4: no TCP rules")
    server, port, hits = await _listener()
    async with server:
        result = await exec_(ws, CONNECT.format(port=port), Confinement(hosts=("example.org",)))
    assert result.is_error and "Permission denied" in text_of(result)
    assert hits == []


@confined_host
async def test_unix_sockets_cannot_be_opened(ws: Path, outside: Path) -> None:
    """A host daemon's socket (docker, systemd) is out of reach: socket(AF_UNIX) is refused."""
    path = outside / "daemon.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    try:
        code = (
            "import socket; s = socket.socket(socket.AF_UNIX); "
            f"s.connect({str(path)!r}); print('connected')"
        )
        result = await exec_(ws, f"python3 -c {code!r}")
    finally:
        server.close()
    assert result.is_error and "connected" not in text_of(result)
    assert "Operation not permitted" in text_of(result)


@confined_host
async def test_io_uring_is_refused(ws: Path) -> None:
    """io_uring could open sockets around the seccomp filter: its setup call is refused."""
    code = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
        "print(libc.syscall(425, 8, None), ctypes.get_errno())"  # io_uring_setup
    )
    result = await exec_(ws, f"python3 -c '{code}'")
    assert not result.is_error, text_of(result)
    assert text_of(result) == "-1 1"  # EPERM


# --- environment ---------------------------------------------------------------------------


@confined_host
async def test_the_environment_is_built_from_an_allow_list(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {
        "ANTHROPIC_API_KEY": "sk-ant-1", "NANOCRAB_HOME": "/data", "AWS_ACCESS_KEY_ID": "AKIA1",
        "GITHUB_TOKEN": "ghp_1", "MY_SECRET": "x1", "DB_PASSWORD": "pw1",
    }  # fmt: skip
    for name, value in {**secrets, "LANG": "C.UTF-8", "BUILD_FLAVOUR": "fast"}.items():
        monkeypatch.setenv(name, value)
    result = await exec_(ws, "env", Confinement(env=("BUILD_FLAVOUR", "MY_SECRET")))
    assert not result.is_error, text_of(result)
    env = dict(line.split("=", 1) for line in text_of(result).splitlines() if "=" in line)
    assert not set(secrets) & set(env), env
    assert env["LANG"] == "C.UTF-8" and env["BUILD_FLAVOUR"] == "fast"
    assert env["HOME"] == env["TMPDIR"] and env["SHELL"] == "/bin/sh"
    assert os.path.dirname(sys.executable) in env["PATH"].split(":")


def test_path_keeps_readable_entries_with_the_interpreter_in_place_of_the_first_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system, home, venv = tmp_path / "system", tmp_path / "home", tmp_path / "venv"
    for d in (system / "bin", system / "sbin", home / ".local" / "bin", venv / "bin"):
        d.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python3"))
    runtime = {"PATH": f"{system}/sbin:rel:{home}/.local/bin:{system}/bin"}
    env = build_env(runtime, extra=(), home=tmp_path, readable=(system, venv))
    assert env["PATH"].split(":") == [f"{system}/sbin", f"{venv}/bin", f"{system}/bin"]
    env = build_env(runtime, extra=(), home=tmp_path, readable=(system,))
    assert env["PATH"].split(":") == [f"{system}/sbin", f"{system}/bin"], "unreadable: left out"


def test_secret_like_names() -> None:
    for name in ("ANTHROPIC_API_KEY", "NANOCRAB_NATS_URL", "AWS_REGION", "GH_TOKEN",
                 "client_secret", "SSH_AUTH_SOCK", "PGPASSWORD"):  # fmt: skip
        assert secret_like(name), name
    for name in ("LANG", "TERM", "PIP_INDEX_URL", "BUILD_FLAVOUR"):
        assert not secret_like(name), name


# --- limits --------------------------------------------------------------------------------


@confined_host
async def test_a_memory_hog_is_stopped(ws: Path) -> None:
    command = "python3 -c 'b = bytearray(2 << 30); print(\"allocated\")'"
    result = await exec_(ws, command, Confinement(limits=Limits(memory_mb=512)))
    assert result.is_error and "MemoryError" in text_of(result)
    assert "allocated" not in text_of(result)


@confined_host
async def test_a_huge_file_is_stopped(ws: Path) -> None:
    result = await exec_(
        ws, "head -c 3000000 /dev/zero > big", Confinement(limits=Limits(file_size_mb=1))
    )
    assert result.is_error
    assert (ws / "big").stat().st_size == 1024 * 1024


def _as_nobody(workspace: Path, command: str, limits: Limits, timeout_s: float = 30) -> str:
    """Run one confined command from a child process that dropped to uid/gid 65534 (the
    kernel does not apply RLIMIT_NPROC to root); returns its output."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read)
            # the checkout may sit where uid 65534 cannot read it (a 0700 temporary directory):
            # the spawner runs from a world-readable copy of its one file
            readable = Path(tempfile.mkdtemp(prefix="nanocrab-zygote-"))
            readable.chmod(0o755)
            spawner._ZYGOTE = Path(shutil.copy(spawner._ZYGOTE, readable / "zygote.py"))
            spawner._ZYGOTE.chmod(0o644)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            # setuid made this process non-dumpable, which makes /proc/self root's; a user who
            # starts nanocrab directly is dumpable, as this restores
            ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
            # this interpreter may live where uid 65534 cannot exec it (under /root): the
            # spawner needs only a standard library
            spawner._PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
            ctx = make_ctx(
                workspace,
                ops=FAST_KILL,
                timeout_s=timeout_s,
                confinement=Confinement(limits=limits),
                artifacts=MemoryArtifacts(),  # a bomb's "Cannot fork" lines may pass the cap
            )
            result = asyncio.run(
                ToolRegistry(default_tools()).invoke("exec", {"command": command}, ctx)
            )
            os.write(write, text_of(result).encode())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


@confined_host
def test_the_process_limit_stops_a_fork_loop() -> None:
    """200 background processes against a limit of 30 tasks: forks fail (the shell gives up),
    and the processes started are all stopped with the call. Run as uid 65534 when the tests run as root."""
    root = os.geteuid() == 0
    with tempfile.TemporaryDirectory(prefix="nanocrab-nproc-") as top:
        workspace = Path(top).resolve()
        command = 'i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); echo "started $i"; done'
        if root:
            os.chown(workspace, 65534, 65534)
            out = _as_nobody(workspace, command, Limits(processes=30))
        else:
            ctx = make_ctx(workspace, ops=FAST_KILL, timeout_s=30,
                           confinement=Confinement(limits=Limits(processes=30)))  # fmt: skip
            tools = ToolRegistry(default_tools())
            out = text_of(asyncio.run(tools.invoke("exec", {"command": command}, ctx)))
    started = [int(n) for n in re.findall(r"started (\d+)", out)]
    assert "Cannot fork" in out and started, out
    assert 10 < max(started) < 30, "the shell and its children fit 30 tasks, not 200"
    user = "65534" if root else str(os.geteuid())
    leftover = subprocess.run(["pgrep", "-u", user, "-f", "^sleep 30$"], capture_output=True)
    assert leftover.stdout == b"", "the call's processes are stopped with it"


@confined_host
def test_a_fork_bomb_is_contained() -> None:
    """The classic bomb, bounded by the same limit; the timeout ends it and every process of it
    is gone afterwards."""
    root = os.geteuid() == 0
    with tempfile.TemporaryDirectory(prefix="nanocrab-bomb-") as top:
        workspace = Path(top).resolve()
        # every process of this bomb carries the marker in its command line (forks, no exec):
        # another copy of the suite may run its own bomb as the same user at the same time
        marker = f"nanocrab-bomb-{os.getpid()}-{workspace.name}"
        command = f": {marker}; bomb() {{ bomb | bomb & }}; bomb; sleep 2; echo survived"
        limits = Limits(processes=40)
        if root:
            os.chown(workspace, 65534, 65534)
            out = _as_nobody(workspace, command, limits, timeout_s=5)
        else:
            ctx = make_ctx(workspace, ops=FAST_KILL, timeout_s=5, artifacts=MemoryArtifacts(),
                           confinement=Confinement(limits=limits))  # fmt: skip
            tools = ToolRegistry(default_tools())
            out = text_of(asyncio.run(tools.invoke("exec", {"command": command}, ctx)))
    assert "Cannot fork" in out, out
    leftover = subprocess.run(["pgrep", "-f", marker], capture_output=True)
    assert leftover.stdout == b"", "no process of the bomb outlives the call"


# --- signals -------------------------------------------------------------------------------


@confined_host
async def test_the_runtime_cannot_be_signalled(ws: Path) -> None:
    if HOST.abi < 6:
        pytest.skip("Landlock ABI < 6: no signal scoping")
    result = await exec_(ws, f"kill -0 {os.getpid()} && echo reachable")
    assert result.is_error and "reachable" not in text_of(result)


# --- ordinary work still works confined ----------------------------------------------------


@confined_host
async def test_python_git_and_test_runners_work_confined(repo: Path) -> None:
    ws = repo
    (ws / "test_sample.py").write_text(
        "import tempfile\n\ndef test_ok(tmp_path):\n    (tmp_path / 'f').write_text('x')\n"
        "    assert tempfile.gettempdir()\n\n"
        "import unittest\n\nclass T(unittest.TestCase):\n    def test_ok(self):\n"
        "        self.assertTrue(True)\n"
    )
    for command, expect in (
        ("python3 -c pass && echo ok", "ok"),
        ("git status --short", "?? test_sample.py"),
        ("python3 -m pytest -q -p no:cacheprovider test_sample.py", "2 passed"),
        ("python3 -m unittest -q test_sample 2>&1", "OK"),
        ("echo to-stderr > /dev/stderr; ls /usr/bin/env > /dev/null && echo devnull", "devnull"),
    ):
        result = await exec_(ws, command)
        assert not result.is_error, (command, text_of(result))
        assert expect in text_of(result), (command, text_of(result))
        assert details(result).confined


@confined_host
async def test_the_demo_command_runs_confined(ws: Path) -> None:
    from nanocrab import demo

    for source in (Path(demo.__file__).parent / "workspace").iterdir():
        shutil.copy(source, ws / source.name)
    greet = ws / "greet.py"
    greet.write_text(greet.read_text().replace('"Hello " + name', 'f"Hello, {name}!"'))
    result = await exec_(ws, "python3 -m unittest -q test_greet")
    assert not result.is_error, text_of(result)
    assert details(result).confined and "Ran 1 test" in text_of(result)


@confined_host
async def test_timeout_still_kills_the_confined_process_group(ws: Path) -> None:
    m = sleep_marker()
    result = await exec_(ws, f"sleep {m} & sleep {m}", ops=FAST_KILL, timeout_s=1)
    assert result.error_kind == "timeout" and details(result).confined
    assert sleeping(m) == []


@confined_host
async def test_nothing_a_command_starts_outlives_it(ws: Path) -> None:
    """A process that leaves the command's session (``setsid``, a double fork) is neither in
    its process group nor among its descendants once reparented: the command's own process-id
    namespace ends it with the command."""
    m = sleep_marker()
    command = f"setsid sh -c 'sleep {m}' > /dev/null 2>&1 & (sleep {m} &) ; echo started"
    result = await exec_(ws, command)
    assert not result.is_error and "started" in text_of(result), text_of(result)
    assert sleeping(m) == []


# --- when the host cannot confine: fail closed ---------------------------------------------


def _unavailable() -> LocalOperations:
    async def status() -> SandboxStatus:
        return SandboxStatus.unavailable("test: Landlock ABI 0")

    return LocalOperations(sandbox_status=status)


async def test_a_safe_call_is_refused_when_the_sandbox_is_unavailable(ws: Path) -> None:
    result = await exec_(ws, "touch ran", ops=_unavailable())
    assert result.is_error and result.error_kind == "denied"
    assert "test: Landlock ABI 0" in text_of(result)
    assert "exec: {sandbox: off}" in text_of(result)
    assert not (ws / "ran").exists()
    assert not details(result).confined
    assert details(result).unconfined_reason == "test: Landlock ABI 0"


async def test_an_approved_call_runs_unconfined_with_a_note(ws: Path) -> None:
    result = await exec_(ws, "touch ran", Confinement(tier="guarded"), ops=_unavailable())
    assert not result.is_error, text_of(result)
    assert (ws / "ran").exists()
    assert "ran without the sandbox" in text_of(result) and "Landlock ABI 0" in text_of(result)
    assert not details(result).confined
    assert "Landlock ABI 0" in (details(result).unconfined_reason or "")


async def test_the_policy_opt_out_runs_unconfined(ws: Path, outside: Path) -> None:
    (outside / "f").write_text("readable")
    result = await exec_(ws, f"cat {outside}/f", Confinement(required=False), ops=_unavailable())
    assert not result.is_error and text_of(result) == "readable"
    assert not details(result).confined
    assert "exec.sandbox: off" in (details(result).unconfined_reason or "")


@confined_host
async def test_a_failing_sandbox_setup_is_a_failed_call(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("nanocrab.tools.confine.jail.UNSHARE", 1)  # not a namespace flag
    result = await exec_(ws, "touch ran")
    assert result.error_kind == "failed"
    assert "The sandbox could not be set up: unshare" in text_of(result)
    assert not (ws / "ran").exists()


def test_old_exec_details_decode_as_unconfined() -> None:
    old = b'{"type":"exec","command":"ls","exit_code":0,"duration_ms":1.0}'
    decoded = msgspec.json.decode(old, type=ExecDetails)
    assert decoded.confined is False and decoded.unconfined_reason is None


def test_the_probe_reports_this_host() -> None:
    status = probe()
    assert status == HOST
    if status.available:
        assert status.abi == landlock.abi_version() >= 3
    else:
        assert status.detail


# --- the policy's exec section -------------------------------------------------------------


def test_the_bundled_policy_requires_the_sandbox() -> None:
    conf = load_policy().exec.confinement(protected=(Path("/data"),))
    assert conf.required and conf.tier == "safe" and conf.hosts == () and conf.protect_git
    assert conf.protected == (Path("/data"),)


def test_the_policy_exec_section() -> None:
    policy = Policy.from_mapping(
        {"version": 1, "exec": {"sandbox": "off", "env": ["PIP_INDEX_URL", "LC_*"],
                                "read_paths": ["~/toolchain"], "limits": {"memory_mb": 64}}}
    )  # fmt: skip
    conf = policy.exec.confinement()
    assert not conf.required and conf.env == ("PIP_INDEX_URL", "LC_*")
    assert conf.read_paths == (Path.home() / "toolchain",) and conf.limits.memory_mb == 64
    for bad, message in (
        ({"env": ["ANTHROPIC_API_KEY"]}, "looks like a secret"),
        ({"env": ["GH_TOKEN"]}, "looks like a secret"),
        ({"env": ["A B"]}, "not a variable name"),
        ({"sandbox": "maybe"}, "sandbox"),
        ({"read_paths": ["relative"]}, "absolute"),
        ({"limits": {"processes": 0}}, "processes"),
        ({"network": True}, "unknown key"),
    ):
        with pytest.raises(PolicyError, match=message):
            Policy.from_mapping({"version": 1, "exec": bad})


def test_a_grant_sets_tier_and_hosts() -> None:
    from nanocrab.events import Capability

    base = Confinement(env=("X",))
    conf = base.for_grant(
        "guarded", [Capability(tool="exec", resource="pypi.example", access="network"),
                    Capability(tool="exec", resource="ls", access="execute")]
    )  # fmt: skip
    assert conf.approved and conf.hosts == ("pypi.example",) and conf.env == ("X",)
    assert not base.for_grant("safe", []).approved
