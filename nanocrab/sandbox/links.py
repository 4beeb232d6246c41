"""No links out of a writable mount: the guest creates none, and none it moves out survives.

A symlink in a writable mount outlives the run; host tools and people working in that directory
later may follow it. wasmtime's file system (cap-std) already stops the *guest* following a link
out of its mounts, and refuses absolute targets, but it lets the guest create relative ones —
``os.symlink('../../etc/passwd', 'x')`` — and hard links between files it can see. So:

- :func:`install` replaces the WASI ``path_symlink`` and ``path_link`` imports with ones that
  refuse (``EPERM``: a ``PermissionError`` in the guest, as for a read-only mount). No test of
  the target can be trusted: a relative target's meaning changes as the tree around it changes
  (``a -> sub/up/..`` with ``sub/up -> ..``), so no new link may exist at all.
- The guest can still *rename* a link that was already in the mount to where it points outside
  (``sub/up -> ..`` moved to ``up``). :func:`new_links_out` and :func:`remove_beneath` let a
  structured call (:mod:`.runner`) find such links after the run and remove them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

import wasmtime

_WASI = "wasi_snapshot_preview1"
_EPERM = 63  # WASI preview 1 ERRNO_PERM
_I32 = wasmtime.ValType.i32()


def _refuse(*_args: int) -> int:
    return _EPERM


def install(linker: wasmtime.Linker) -> None:
    """Shadow wasmtime's ``path_symlink`` (five i32 parameters) and ``path_link`` (seven)
    with imports that refuse every call without touching the file system."""
    linker.allow_shadowing = True
    for name, params in (("path_symlink", 5), ("path_link", 7)):
        linker.define_func(_WASI, name, wasmtime.FuncType([_I32] * params, [_I32]), _refuse)


Snapshot = Mapping[str, tuple[int, int, int, int]]
"""Entries below a root, by ``/``-separated relative path: (mtime ns, size, inode, lstat mode)."""


def links_out(root: Path, snapshot: Snapshot) -> set[str]:
    """The symlinks in ``snapshot`` that resolve (every link followed, dangling ones too)
    outside ``root``'s real path."""
    real_root = os.path.realpath(root)
    return {
        rel
        for rel, entry in snapshot.items()
        if stat.S_ISLNK(entry[3]) and _outside(real_root, os.path.join(real_root, rel))
    }


def new_links_out(root: Path, before: Snapshot, after: Snapshot, out_before: set[str]) -> list[str]:
    """The symlinks of ``after`` that resolve outside ``root`` and did not before the run (new,
    changed, or moved out by a rename around them), sorted. A link that already pointed
    outside and was left untouched is the owner's, not the guest's, and is not listed."""
    return sorted(
        rel
        for rel in links_out(root, after)
        if rel not in out_before or before.get(rel) != after.get(rel)
    )


def _outside(real_root: str, path: str) -> bool:
    target = os.path.realpath(path)
    try:
        return os.path.commonpath([real_root, target]) != real_root
    except ValueError:
        return True


def remove_beneath(root: Path, rel: str) -> bool:
    """Unlink ``root/rel`` without following any link on the way: each directory is opened
    with ``O_NOFOLLOW``, so a directory swapped for a link cannot redirect the unlink out of
    ``root``. False when it could not be removed (gone, or a component is not a directory)."""
    *folders, name = Path(rel).parts
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(os.path.realpath(root), flags)
    except OSError:
        return False
    try:
        for folder in folders:
            child = os.open(folder, flags, dir_fd=fd)
            os.close(fd)
            fd = child
        os.unlink(name, dir_fd=fd)
    except OSError:
        return False
    finally:
        with suppress(OSError):
            os.close(fd)
    return True
