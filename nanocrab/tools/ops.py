"""The operations backend tools run on: files and processes, here or on a remote host.

Tools never touch ``os`` directly; they call an :class:`Operations` taken from the context, so the
same tool code can work on a container or a remote host (:mod:`nanocrab.tools.ssh`). A tool
turns its argument into a path with the backend's :meth:`Operations.resolve`, so paths given to
a backend are already resolved and confined to the workspace (see :mod:`nanocrab.tools.paths`),
and every file method takes that ``workspace`` too: the backend enforces the confinement again
*when it opens the path*, so a symlink swapped in after the tool's check (by a concurrent
process or a parallel call) is not followed out of it. Backends report file failures as the
``OSError`` subclasses the ``os`` module uses (``FileNotFoundError``, ``IsADirectoryError``,
``NotADirectoryError``, ``PermissionError``; a path leading out of the workspace is the
``PermissionError`` subclass :class:`~nanocrab.tools.paths.PathEscape`); tools translate them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import secrets
import stat
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nanocrab.tools.base import OutputSink
from nanocrab.tools.confine import Confinement, Jail, SandboxStatus, SandboxUnavailable, host_status
from nanocrab.tools.paths import PathEscape, beneath, resolve_in_workspace
from nanocrab.tools.process import ProcessOutcome, Spawn, run_local_process, spawn_local

__all__ = [
    "DirEntry",
    "FileInfo",
    "LocalOperations",
    "Operations",
    "PathEscape",
    "ProcessOutcome",
    "WalkEntry",
    "link_inside",
]


@dataclass(frozen=True, slots=True)
class FileInfo:
    """What ``stat`` tells a tool (symlinks followed inside the workspace); ``size`` in bytes."""

    is_dir: bool
    size: int


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One entry of a directory listing; ``is_dir`` and ``size`` follow symlinks that stay inside
    the workspace (a link leading out, or dangling: not a directory, size 0); ``size`` is 0 for
    directories."""

    name: str
    is_dir: bool
    size: int


@dataclass(frozen=True, slots=True)
class WalkEntry:
    """One entry met while walking a tree.

    ``rel`` is the ``/``-separated path relative to the walk's root. ``is_dir`` follows symlinks
    that stay inside the workspace (one leading out: ``False``); ``is_symlink`` says the entry
    itself is a link, which the walk never descends into. Opening ``path`` later goes through
    the backend again, which checks containment at that moment.
    """

    path: Path
    rel: str
    is_dir: bool
    is_symlink: bool


class Operations(Protocol):
    """File and process primitives a tool may use.

    File methods take the run's ``workspace`` (a real path) and a ``path`` inside it. Whatever
    the tree looks like when the call runs, they act only inside ``workspace``: a symlink on the
    way is followed while it stays inside, and one leading out fails the call with
    :class:`~nanocrab.tools.paths.PathEscape` (``walk`` neither yields its target's kind nor
    enters it).
    """

    async def resolve(self, workspace: Path, path: str) -> Path:
        """The real path a tool's ``path`` argument (relative to ``workspace``, or absolute)
        names, inside ``workspace``: :func:`~nanocrab.tools.paths.resolve_in_workspace` with
        the symlinks of this backend's tree. Raises its ``ToolError`` failures (``path_escape``
        when it resolves outside). Only the tool's first check: the file methods check again."""
        ...

    async def read_bytes(self, path: Path, *, workspace: Path) -> bytes:
        """The whole file."""
        ...

    async def write_bytes(self, path: Path, data: bytes, *, workspace: Path) -> None:
        """Replace the file atomically (readers see the old or the new bytes, never a mix),
        creating missing parent directories. ``path`` is the final target; a symlink there
        (swapped in since it was resolved) is followed only inside the workspace."""
        ...

    async def stat(self, path: Path, *, workspace: Path) -> FileInfo | None:
        """Size and kind of ``path``, or ``None`` when nothing exists there."""
        ...

    async def list_dir(self, path: Path, *, workspace: Path) -> list[DirEntry]:
        """The entries of a directory, in no particular order."""
        ...

    def walk(
        self, root: Path, *, workspace: Path, prune: Collection[str] = ()
    ) -> AsyncGenerator[WalkEntry, None]:
        """Every entry below ``root``, without following directory symlinks and skipping
        (neither yielding nor entering) entries whose name is in ``prune``. Unreadable
        directories, and directories swapped for a symlink while walking, are skipped. A caller
        that stops early closes it (``contextlib.aclosing``) to release what it holds now."""
        ...

    async def run_process(
        self,
        command: str,
        *,
        cwd: Path,
        timeout_s: float,
        cancel: asyncio.Event,
        on_output: OutputSink,
        env: dict[str, str] | None = None,
        confinement: Confinement | None = None,
    ) -> ProcessOutcome:
        """Run ``command`` with ``/bin/sh -c``; see
        :func:`~nanocrab.tools.process.run_local_process` for the contract.

        With ``confinement`` the command runs in the backend's sandbox, ``cwd`` being the one
        writable tree, and ``env`` (default: this process's environment) is only the source the
        sandbox's allow-list picks from. Raises
        :class:`~nanocrab.tools.confine.SandboxUnavailable` when this backend cannot confine
        commands (nothing ran) and :class:`~nanocrab.tools.confine.SandboxFailed` when setting
        up the sandbox for this command failed (nothing ran). ``None``: unconfined.
        """
        ...


async def link_inside(ops: Operations, path: Path, *, workspace: Path) -> bool:
    """Whether the symlink ``walk`` met at ``path`` stays inside the workspace as ``ops``
    resolves it, on the backend's own host (a remote one's links are not this host's): ``False``
    only when following it leads out (:class:`~nanocrab.tools.paths.PathEscape`); a link that
    dangles or loops counts as inside (opening it fails later)."""
    try:
        await ops.stat(path, workspace=workspace)
    except PathEscape:
        return False
    except OSError:
        return True
    return True


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class LocalOperations:
    """:class:`Operations` on this host's file system and processes.

    File operations are plain synchronous system calls (the module's private functions): for the
    small files tools handle, a thread hop would cost more than the I/O. ``walk`` yields to the
    event loop every few directories so large trees do not starve it. Every path is opened
    relative to the workspace with :func:`~nanocrab.tools.paths.beneath` (one ``openat`` per
    directory level, no symlink followed by the kernel); ``walk`` holds a descriptor per level of
    the directory it is in and enters each subdirectory from its parent's.

    Confined processes run in :mod:`nanocrab.tools.confine`'s sandbox. ``sandbox_status`` says
    whether this host can confine them; the default probes the host once per process.
    """

    def __init__(
        self,
        *,
        kill_grace_s: float = 2.0,
        drain_s: float = 1.0,
        max_output_bytes: int = 64 * 1024 * 1024,
        sandbox_status: Callable[[], Awaitable[SandboxStatus]] = host_status,
    ) -> None:
        self.kill_grace_s = kill_grace_s
        self.drain_s = drain_s
        self.max_output_bytes = max_output_bytes
        self.sandbox_status = sandbox_status
        self._new_file_mode = 0o666 & ~_current_umask()

    async def resolve(self, workspace: Path, path: str) -> Path:
        return resolve_in_workspace(workspace, path)

    async def read_bytes(self, path: Path, *, workspace: Path) -> bytes:
        return beneath(workspace, path, _read)

    async def write_bytes(self, path: Path, data: bytes, *, workspace: Path) -> None:
        mode = self._new_file_mode

        def write(dir_fd: int, name: str, parts: tuple[str, ...]) -> None:
            _write_atomic(dir_fd, name, data, new_file_mode=mode)

        beneath(workspace, path, write, make_dirs=True)

    async def stat(self, path: Path, *, workspace: Path) -> FileInfo | None:
        return _stat(workspace, path)

    async def list_dir(self, path: Path, *, workspace: Path) -> list[DirEntry]:
        def list_at(dir_fd: int, name: str, parts: tuple[str, ...]) -> list[DirEntry]:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                return _list_dir(workspace, fd, (*parts, name))
            finally:
                os.close(fd)

        return beneath(workspace, path, list_at)

    async def walk(
        self, root: Path, *, workspace: Path, prune: Collection[str] = ()
    ) -> AsyncGenerator[WalkEntry, None]:
        try:
            fd, parts = beneath(workspace, root, _open_dir)
        except PathEscape:
            raise
        except OSError:
            return  # an unreadable root is skipped like any unreadable directory
        base = os.fspath(root)
        frames: list[_Frame] = []
        try:
            entries, top = _enter(workspace, base, fd, "", parts, prune)
            frames.append(top)
            for entry in entries:
                yield entry
            visited = 1
            while frames:
                frame = frames[-1]
                if not frame.subdirs:
                    os.close(frames.pop().fd)
                    continue
                name = frame.subdirs.pop()
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=frame.fd)
                except OSError:
                    continue  # gone, unreadable, or swapped for a symlink: not entered
                rel = f"{frame.rel}/{name}" if frame.rel else name
                entries, top = _enter(workspace, base, fd, rel, (*frame.parts, name), prune)
                frames.append(top)
                for entry in entries:
                    yield entry
                visited += 1
                if visited % 32 == 0:
                    await asyncio.sleep(0)
        finally:
            for frame in frames:
                os.close(frame.fd)

    async def run_process(
        self,
        command: str,
        *,
        cwd: Path,
        timeout_s: float,
        cancel: asyncio.Event,
        on_output: OutputSink,
        env: dict[str, str] | None = None,
        confinement: Confinement | None = None,
    ) -> ProcessOutcome:
        if confinement is None:
            return await self._run(command, cwd, timeout_s, cancel, on_output, env, spawn_local)
        status = await self.sandbox_status()
        if not status.available:
            raise SandboxUnavailable(status.detail)
        jail = Jail(confinement, workspace=cwd, timeout_s=timeout_s, abi=status.abi, base_env=env)
        with jail:
            outcome = await self._run(command, cwd, timeout_s, cancel, on_output, None, jail.spawn)
            removed = jail.discard_new_git()
            if removed:
                note = NEW_GIT_NOTE.format(", ".join(removed)).encode()
                outcome = dataclasses.replace(outcome, output=outcome.output + note)
            return outcome

    async def _run(
        self,
        command: str,
        cwd: Path,
        timeout_s: float,
        cancel: asyncio.Event,
        on_output: OutputSink,
        env: dict[str, str] | None,
        spawn: Spawn,
    ) -> ProcessOutcome:
        return await run_local_process(
            command,
            cwd=cwd,
            timeout_s=timeout_s,
            cancel=cancel,
            on_output=on_output,
            env=env,
            spawn=spawn,
            kill_grace_s=self.kill_grace_s,
            drain_s=self.drain_s,
            max_output_bytes=self.max_output_bytes,
        )


NEW_GIT_NOTE = (
    "\n[nanocrab: {} created by this command was removed: it would have had the user's own git "
    "read configuration and hooks that this command wrote, and run them outside the sandbox]\n"
)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _read(dir_fd: int, name: str, parts: tuple[str, ...]) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with open(fd, "rb") as f:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
        return f.read()


def _write_atomic(dir_fd: int, name: str, data: bytes, *, new_file_mode: int) -> None:
    """Write ``data`` to a new file in ``dir_fd`` and rename it over ``name`` there. A symlink
    at ``name`` is reported (``ELOOP``) for :func:`beneath` to follow; one swapped in after
    that check is replaced by the file, never written through."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        mode = new_file_mode
    else:
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
        mode = stat.S_IMODE(st.st_mode)
    fd, tmp = _temp_file(dir_fd, name)
    try:
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(fd)
            os.fchmod(fd, mode)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _temp_file(dir_fd: int, name: str) -> tuple[int, str]:
    """A new, empty, private file next to ``name`` (``O_EXCL``: never an existing one)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(16):
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o600, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", name)


def _stat(workspace: Path, path: Path | str) -> FileInfo | None:
    try:
        return beneath(workspace, path, _stat_at)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _stat_at(dir_fd: int, name: str, parts: tuple[str, ...]) -> FileInfo:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
    is_dir = stat.S_ISDIR(st.st_mode)
    return FileInfo(is_dir=is_dir, size=0 if is_dir else st.st_size)


def _linked(workspace: Path, parts: tuple[str, ...]) -> FileInfo | None:
    """What the symlink at ``parts`` (below the workspace) leads to, ``None`` when it dangles
    or leads out of the workspace."""
    try:
        return _stat(workspace, "/".join(parts))
    except OSError:
        return None


def _open_dir(dir_fd: int, name: str, parts: tuple[str, ...]) -> tuple[int, tuple[str, ...]]:
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd), (*parts, name)


def _list_dir(workspace: Path, fd: int, parts: tuple[str, ...]) -> list[DirEntry]:
    entries = []
    with os.scandir(fd) as it:
        for entry in it:
            try:
                if entry.is_symlink():
                    info = _linked(workspace, (*parts, entry.name))
                    is_dir = info is not None and info.is_dir
                    size = 0 if info is None else info.size
                else:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    size = 0 if is_dir else entry.stat(follow_symlinks=False).st_size
            except OSError:
                is_dir, size = False, 0
            entries.append(DirEntry(name=entry.name, is_dir=is_dir, size=size))
    return entries


@dataclass(slots=True)
class _Frame:
    """A directory ``walk`` is in: its descriptor (owned), its path relative to the walk's root
    and below the workspace, and the subdirectories still to enter (last first)."""

    fd: int
    rel: str
    parts: tuple[str, ...]
    subdirs: list[str]


def _enter(
    workspace: Path, base: str, fd: int, rel: str, parts: tuple[str, ...], prune: Collection[str]
) -> tuple[list[WalkEntry], _Frame]:
    """The entries of the directory open as ``fd`` (which the returned frame now owns), sorted
    by name, ``[]`` when it cannot be read."""
    try:
        with os.scandir(fd) as it:
            found = sorted(it, key=lambda e: e.name)
    except OSError:
        found = []
    out = []
    subdirs = []
    for entry in found:
        if entry.name in prune:
            continue
        try:
            is_symlink = entry.is_symlink()
            if is_symlink:
                info = _linked(workspace, (*parts, entry.name))
                is_dir = info is not None and info.is_dir
            else:
                is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_symlink, is_dir = False, False
        entry_rel = f"{rel}/{entry.name}" if rel else entry.name
        out.append(
            WalkEntry(
                path=Path(os.path.join(base, entry_rel)),
                rel=entry_rel,
                is_dir=is_dir,
                is_symlink=is_symlink,
            )
        )
        if is_dir and not is_symlink:
            subdirs.append(entry.name)
    subdirs.reverse()
    return out, _Frame(fd=fd, rel=rel, parts=parts, subdirs=subdirs)
