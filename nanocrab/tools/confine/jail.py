"""The runtime's side of one confined command: the Landlock ruleset, the environment, a private
temporary directory and the spawner's request — built before the spawn, released after the
call."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import resource
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from nanocrab.tools.confine import landlock, seccomp
from nanocrab.tools.confine.env import build_env
from nanocrab.tools.confine.layout import (
    DEVICES,
    git_mounts,
    mask_mounts,
    system_roots,
    writable_only,
)
from nanocrab.tools.confine.spawner import ConfinedChild, SpawnerError, spawn
from nanocrab.tools.confine.spec import Confinement

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
UNSHARE = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID
"""Namespaces of every confined command: its own user (an identity map, no capability
outside), mounts (:func:`~nanocrab.tools.confine.layout.writable_only`), System V IPC and
POSIX message queues (the runtime user's shared memory stays out of reach) and process ids
(nothing it starts outlives it: ``zygote._init``); the network's too unless hosts are
granted."""

MIN_ABI = 3
"""Landlock ABI 3 (Linux 6.2) is the least that confines writes: below it ``truncate(2)`` of
any file the user owns is not controlled."""
WEB_PORTS = (80, 443)
_CPU_MARGIN_S = 5
_NO_DEVICES = landlock.MAKE_CHAR | landlock.MAKE_BLOCK | landlock.IOCTL_DEV
_WRITABLE = landlock.fs_rights(99) & ~_NO_DEVICES
_DEVICE = landlock.READ_FILE | landlock.WRITE_FILE | landlock.TRUNCATE


class ConfinementError(Exception):
    """Root of the sandbox's errors."""


class SandboxUnavailable(ConfinementError):
    """This host cannot confine commands; ``reason`` says what is missing."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SandboxFailed(ConfinementError):
    """Setting up the sandbox for one command failed (the command did not run)."""


@dataclass(frozen=True, slots=True)
class SandboxStatus:
    """Whether this host can confine commands. ``detail``: what is enforced, or why not.
    ``abi``: the Landlock ABI in use (0 when unavailable)."""

    available: bool
    detail: str
    abi: int = 0

    @classmethod
    def unavailable(cls, reason: str) -> SandboxStatus:
        return cls(False, reason)


class Jail:
    """Everything one confined command needs, as a context manager that releases it.

    ``workspace`` (a resolved real path) is the command's working directory and the one
    writable tree besides the private temporary directory ``tmp``. ``env`` is the command's
    environment, built from ``base_env`` (default: this process's). Raises ``OSError`` when
    the workspace cannot be opened.
    """

    def __init__(
        self,
        confinement: Confinement,
        *,
        workspace: Path,
        timeout_s: float,
        abi: int,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="nanocrab-exec-"))
        self._ruleset: landlock.Ruleset | None = None
        dot_git = workspace / ".git"
        self._absent: list[Path] = []
        """What the command must not leave behind that was not there: a ``.git`` (for a call
        no person approved), ``.git/commondir``, ``hooks`` or ``config.worktree`` (for an
        approved one — they are bound read-only where they exist; no git command makes them in
        an existing repository)."""
        if not os.path.lexists(dot_git):
            self._absent += [] if confinement.approved else [dot_git]
        elif dot_git.is_dir() and confinement.protect_git:
            steering = (dot_git / n for n in ("commondir", "hooks", "config.worktree"))
            self._absent += [p for p in steering if not os.path.lexists(p)]
        try:
            readable = (*system_roots(), *confinement.read_paths)
            self._ruleset = _ruleset(abi, confinement, readable, (workspace, self.tmp))
            self.env = build_env(
                os.environ if base_env is None else base_env,
                extra=confinement.env,
                home=self.tmp,
                readable=(*readable, workspace),
            )
            network = bool(confinement.hosts)
            git = git_mounts(workspace, whole=not confinement.approved)
            mounts = [
                *writable_only((workspace, self.tmp)),
                *(git if confinement.protect_git else []),
                *mask_mounts(
                    confinement.protected, readable=(*readable, workspace), workspace=workspace
                ),
            ]
            uid, gid = os.geteuid(), os.getegid()
            self._request: dict[str, Any] = {
                "unshare": UNSHARE | (0 if network else CLONE_NEWNET),
                "id_maps": [
                    ["/proc/self/setgroups", "deny"],
                    ["/proc/self/uid_map", f"{uid} {uid} 1"],
                    ["/proc/self/gid_map", f"{gid} {gid} 1"],
                ],
                "mounts": [m.request() for m in mounts],
                "seccomp": _filter(),
                "rlimits": _rlimits(confinement, timeout_s),
            }
        except BaseException:
            self.close()
            raise

    def start(self, argv: list[str], *, cwd: Path, stdout: int, stderr: int) -> ConfinedChild:
        """Start ``argv`` confined in ``cwd`` with the jail's :attr:`env`. Raises
        :class:`SandboxFailed` when the child could not confine itself (nothing ran)."""
        assert self._ruleset is not None
        req = {**self._request, "argv": argv, "cwd": os.fspath(cwd), "env": self.env}
        try:
            return spawn(req, stdout=stdout, stderr=stderr, ruleset_fd=self._ruleset.fd)
        except SpawnerError as exc:
            raise SandboxFailed(str(exc)) from exc

    async def spawn(
        self, argv: list[str], *, cwd: Path, env: Mapping[str, str] | None, stdout: int, stderr: int
    ) -> ConfinedChild:
        """:meth:`start` as a :data:`~nanocrab.tools.process.Spawn` (``env`` is ignored)."""
        return self.start(argv, cwd=cwd, stdout=stdout, stderr=stderr)

    def discard_new_git(self) -> list[str]:
        """Remove what steers git that the command created (the names, relative to the
        workspace): a ``.git`` where there was none, after a call no person approved, or a
        ``.git/commondir`` (it moves where git reads its configuration and hooks from). The
        user's own ``git`` would take their configuration (``core.fsmonitor``, hooks) for the
        project's and run it, outside the sandbox. Called once the command has ended — and
        with it everything it started."""
        removed = []
        for path in self._absent:
            if not os.path.lexists(path):
                continue
            if path.is_dir() and not path.is_symlink():
                _remove_tree(path)
            else:
                path.unlink()
            removed.append(f"{path.parent.name}/{path.name}" if path.name != ".git" else ".git")
        return removed

    def close(self) -> None:
        """Release the ruleset; remove the temporary directory."""
        if self._ruleset is not None:
            self._ruleset.close()
        _remove_tree(self.tmp)

    def __enter__(self) -> Jail:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _ruleset(
    abi: int, confinement: Confinement, readable: tuple[Path, ...], writable: tuple[Path, ...]
) -> landlock.Ruleset:
    ruleset = landlock.Ruleset(abi)
    try:
        for path in readable:
            ruleset.allow_path(path, landlock.READ_ONLY)
        for device in DEVICES:
            ruleset.allow_path(device, _DEVICE)
        for path in writable:
            ruleset.allow_path(path, _WRITABLE, missing_ok=False)
        if confinement.hosts:
            for port in WEB_PORTS:
                ruleset.allow_tcp_connect(port)
    except BaseException:
        ruleset.close()
        raise
    return ruleset


@functools.cache
def _filter() -> list[seccomp.Instruction]:
    return seccomp.program()


def _rlimits(confinement: Confinement, timeout_s: float) -> list[tuple[int, int]]:
    mb = 1024 * 1024
    limits = confinement.limits
    wanted = (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, math.ceil(timeout_s) + _CPU_MARGIN_S),
        (resource.RLIMIT_DATA, limits.memory_mb * mb),
        (resource.RLIMIT_FSIZE, limits.file_size_mb * mb),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_NPROC, limits.processes),
    )
    out = []
    for which, value in wanted:
        hard = resource.getrlimit(which)[1]
        out.append((which, value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return out


def _remove_tree(path: Path) -> None:
    """Remove ``path`` even where the command took its own permissions away."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError:
        with contextlib.suppress(OSError):
            os.chmod(path, stat.S_IRWXU)
        for root, dirs, _files in os.walk(path):  # top-down: fix a directory before entering
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(root, name), stat.S_IRWXU, follow_symlinks=False)
        shutil.rmtree(path, ignore_errors=True)
