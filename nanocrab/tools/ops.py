"""The operations backend tools run on: files and processes, local now, remote later.

Tools never touch ``os`` directly; they call an :class:`Operations` taken from the context, so the
same tool code can work on a container or a remote host. Paths given to a backend are already
resolved and confined to the workspace (see :mod:`nanocrab.tools.paths`). Backends report file
failures as the ``OSError`` subclasses the ``os`` module uses (``FileNotFoundError``,
``IsADirectoryError``, ``NotADirectoryError``, ``PermissionError``); tools translate them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import tempfile
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nanocrab.tools.base import OutputSink
from nanocrab.tools.process import ProcessOutcome, run_local_process

__all__ = [
    "DirEntry",
    "FileInfo",
    "LocalOperations",
    "Operations",
    "ProcessOutcome",
    "WalkEntry",
]


@dataclass(frozen=True, slots=True)
class FileInfo:
    """What ``stat`` tells a tool (symlinks followed); ``size`` in bytes."""

    is_dir: bool
    size: int


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One entry of a directory listing; ``is_dir`` follows symlinks, ``size`` is 0 for dirs."""

    name: str
    is_dir: bool
    size: int


@dataclass(frozen=True, slots=True)
class WalkEntry:
    """One entry met while walking a tree.

    ``rel`` is the ``/``-separated path relative to the walk's root. ``is_dir`` follows symlinks;
    ``is_symlink`` says the entry itself is a link, which the walk never descends into, so a
    caller that needs containment checks the link's target itself.
    """

    path: Path
    rel: str
    is_dir: bool
    is_symlink: bool


class Operations(Protocol):
    """File and process primitives a tool may use."""

    async def read_bytes(self, path: Path) -> bytes:
        """The whole file."""
        ...

    async def write_bytes(self, path: Path, data: bytes) -> None:
        """Replace the file atomically (readers see the old or the new bytes, never a mix),
        creating missing parent directories. ``path`` is the final target, not a symlink."""
        ...

    async def stat(self, path: Path) -> FileInfo | None:
        """Size and kind of ``path``, or ``None`` when nothing exists there."""
        ...

    async def list_dir(self, path: Path) -> list[DirEntry]:
        """The entries of a directory, in no particular order."""
        ...

    def walk(self, root: Path, *, prune: Collection[str] = ()) -> AsyncIterator[WalkEntry]:
        """Every entry below ``root``, without following directory symlinks and skipping
        (neither yielding nor entering) entries whose name is in ``prune``. Unreadable
        directories are skipped."""
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
    ) -> ProcessOutcome:
        """Run ``command`` with ``/bin/sh -c``; see
        :func:`~nanocrab.tools.process.run_local_process` for the contract."""
        ...


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class LocalOperations:
    """:class:`Operations` on this host's file system and processes.

    File operations are plain synchronous system calls (the module's private functions): for the
    small files tools handle, a thread hop would cost more than the I/O. ``walk`` yields to the
    event loop every few directories so large trees do not starve it.
    """

    def __init__(
        self,
        *,
        kill_grace_s: float = 2.0,
        drain_s: float = 1.0,
        max_output_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.kill_grace_s = kill_grace_s
        self.drain_s = drain_s
        self.max_output_bytes = max_output_bytes
        self._new_file_mode = 0o666 & ~_current_umask()

    async def read_bytes(self, path: Path) -> bytes:
        return _read(path)

    async def write_bytes(self, path: Path, data: bytes) -> None:
        _write_atomic(path, data, new_file_mode=self._new_file_mode)

    async def stat(self, path: Path) -> FileInfo | None:
        return _stat(path)

    async def list_dir(self, path: Path) -> list[DirEntry]:
        return _list_dir(path)

    async def walk(self, root: Path, *, prune: Collection[str] = ()) -> AsyncIterator[WalkEntry]:
        stack: list[tuple[str, str]] = [(os.fspath(root), "")]
        visited = 0
        while stack:
            dirpath, rel = stack.pop()
            subdirs = []
            for entry in _scan(dirpath, rel, prune):
                yield entry
                if entry.is_dir and not entry.is_symlink:
                    subdirs.append((os.fspath(entry.path), entry.rel))
            stack.extend(reversed(subdirs))
            visited += 1
            if visited % 32 == 0:
                await asyncio.sleep(0)

    async def run_process(
        self,
        command: str,
        *,
        cwd: Path,
        timeout_s: float,
        cancel: asyncio.Event,
        on_output: OutputSink,
        env: dict[str, str] | None = None,
    ) -> ProcessOutcome:
        return await run_local_process(
            command,
            cwd=cwd,
            timeout_s=timeout_s,
            cancel=cancel,
            on_output=on_output,
            env=env,
            kill_grace_s=self.kill_grace_s,
            drain_s=self.drain_s,
            max_output_bytes=self.max_output_bytes,
        )


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_atomic(path: Path, data: bytes, *, new_file_mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = new_file_mode
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _stat(path: Path) -> FileInfo | None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    is_dir = stat.S_ISDIR(st.st_mode)
    return FileInfo(is_dir=is_dir, size=0 if is_dir else st.st_size)


def _list_dir(path: Path) -> list[DirEntry]:
    entries = []
    with os.scandir(path) as it:
        for entry in it:
            try:
                is_dir = entry.is_dir()
                size = 0 if is_dir else entry.stat().st_size
            except OSError:
                is_dir, size = False, 0
            entries.append(DirEntry(name=entry.name, is_dir=is_dir, size=size))
    return entries


def _scan(dirpath: str, rel: str, prune: Collection[str]) -> list[WalkEntry]:
    """One directory's entries for ``walk``, sorted by name; ``[]`` when it cannot be read."""
    try:
        with os.scandir(dirpath) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return []
    out = []
    for entry in entries:
        if entry.name in prune:
            continue
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        out.append(
            WalkEntry(
                path=Path(entry.path),
                rel=f"{rel}/{entry.name}" if rel else entry.name,
                is_dir=is_dir,
                is_symlink=entry.is_symlink(),
            )
        )
    return out
