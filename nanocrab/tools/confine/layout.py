"""Which paths a confined command may read, write or not see at all.

Read (and execute): the system's runtime trees (:data:`SYSTEM_DIRS`), the runtime's own Python
prefixes (``sys.prefix``, ``sys.base_prefix``: exactly those trees, even under ``$HOME``), a
short allow-list of files under ``/etc`` (:data:`ETC_FILES` — not ``/etc`` itself, whose
per-package files hold credentials as often as not: ``shadow``, ``ssl/private``, ``npmrc``,
``pip.conf``, ``mysql/debian.cnf`` …), a few character devices (:data:`DEVICES`) and the
policy's ``exec.read_paths``. Read and write: the workspace and the call's private temporary
directory. Everything else — ``$HOME``, the data directory, ``/proc``, ``/sys``, ``/tmp``,
``/var``, ``/run``, other users' homes — is denied by Landlock.

Landlock cannot deny a path beneath one it allows, so what must stay out of reach *inside* an
allowed tree is handled with mounts in the child's private mount namespace: protected paths
(the data directory and its keys, when they lie inside the workspace) are covered by an empty
read-only ``tmpfs``, and the workspace's ``.git`` is pinned (it cannot be renamed or replaced)
with ``config``, ``hooks`` and ``modules`` bound read-only, so a command cannot plant a hook or
a ``core.fsmonitor`` that the user's own ``git`` would later run outside the sandbox.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Mount:
    """One ``mount(2)`` call in the sandbox's mount namespace (``None`` passes NULL)."""

    source: str | None
    target: str
    fstype: str | None
    flags: int
    data: str | None = None

    def request(self) -> list[object]:
        """As the spawner's request holds it (``nanocrab/tools/confine/zygote.py``)."""
        return ["mount", self.source, self.target, self.fstype, self.flags, self.data]


@dataclass(frozen=True, slots=True)
class MountAttrs:
    """One ``mount_setattr(2)`` call: ``set`` and ``clear`` (``MOUNT_ATTR_*``) on the mount at
    ``path``, and on every mount beneath it when ``recursive``. Unlike a remount it needs no
    repeat of the flags a user namespace may not clear, and it reaches the whole tree."""

    path: str
    recursive: bool
    set: int
    clear: int = 0

    def request(self) -> list[object]:
        return ["setattr", self.path, self.recursive, self.set, self.clear]


SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
ETC_FILES = (
    # users, groups and name resolution (glibc NSS)
    "passwd", "group", "nsswitch.conf", "hosts", "host.conf", "resolv.conf", "gai.conf",
    "services", "protocols", "networks",
    # time, locale, the dynamic loader
    "localtime", "timezone", "locale.alias", "locale.conf", "default/locale",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ld.so.preload",
    # TLS trust (certificates only, never ssl/private)
    "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf", "pki/tls/certs",
    "pki/ca-trust/extracted", "crypto-policies",
    # tools' system-wide configuration
    "gitconfig", "mime.types", "magic", "magic.mime", "inputrc", "terminfo", "shells",
    "os-release", "lsb-release", "debian_version", "python3*",
)  # fmt: skip
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
GIT_READ_ONLY = ("config", "hooks", "modules", "commondir", "config.worktree", "worktrees")
"""What in ``.git`` decides where git reads its configuration and hooks from: read-only
whenever it exists (``commondir`` moves them all, ``worktrees/*`` holds linked worktrees'
own)."""

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_RELATIME = 0x200000
_LOCKED = (
    (os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME),
)  # fmt: skip


def python_prefixes() -> tuple[Path, ...]:
    """The runtime interpreter's trees: its virtual environment and the installation."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return tuple(Path(p) for p in sorted(found))


def etc_files() -> Iterator[str]:
    """The :data:`ETC_FILES` that exist here (globs expanded)."""
    for name in ETC_FILES:
        yield from sorted(glob.glob(os.path.join("/etc", name)))


@functools.cache
def system_roots() -> tuple[Path, ...]:
    """Every read-only tree and file of the layout that exists on this host, as given (a rule
    on a link lands on its target). Computed once per process."""
    found = (*SYSTEM_DIRS, *map(str, python_prefixes()), *etc_files())
    return tuple(Path(p) for p in found if os.path.exists(p))


@functools.lru_cache(maxsize=64)
def real_roots(roots: tuple[Path, ...]) -> tuple[Path, ...]:
    """``roots`` with symbolic links resolved (what containment is checked against)."""
    return tuple(dict.fromkeys(Path(os.path.realpath(r)) for r in roots))


def is_within(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or lies beneath it (both taken as given: resolve them first)."""
    return path == root or root in path.parents


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _plain(path: Path) -> bool:
    """``path`` exists and is not a symbolic link (a link could aim the mount elsewhere)."""
    return path.exists() and not path.is_symlink()


def _readonly_bind(path: Path, locked: int, *, recursive: bool = False) -> Iterator[Mount]:
    target = os.fspath(path)
    yield Mount(target, target, None, MS_BIND | (MS_REC if recursive else 0))
    # a user namespace may not clear the flags the original mount has: repeat them
    yield Mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | locked)


def locked_flags(path: Path) -> int:
    """The mount flags of the file system ``path`` is on, as a remount must repeat them."""
    flags = os.statvfs(path).f_flag
    return sum(ms for st, ms in _LOCKED if flags & st)


def writable_only(writable: Iterable[Path]) -> list[Mount | MountAttrs]:
    """Every mount of the sandbox read-only and ``nosuid`` but ``writable`` (the workspace, the
    private temporary directory: bound onto themselves first, so they are mounts of their own),
    which stay writable and become ``nosuid,nodev``.

    Landlock decides which files a command may open and create, but not ``chmod``, ``chown``,
    ``utime`` or extended attributes of a path it can name: without this, a confined command
    could make the data directory's keys readable to everyone, or a file outside set-uid.
    A writable tree the host mounted read-only stays read-only (its flag is locked)."""
    trees = [os.fspath(p) for p in writable]
    steps: list[Mount | MountAttrs] = [Mount(t, t, None, MS_BIND | MS_REC) for t in trees]
    steps.append(MountAttrs("/", True, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID))
    for tree in trees:
        host_readonly = bool(os.statvfs(tree).f_flag & os.ST_RDONLY)
        steps.append(MountAttrs(tree, False, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                                0 if host_readonly else MOUNT_ATTR_RDONLY))  # fmt: skip
    return steps


def git_mounts(workspace: Path, *, whole: bool = False) -> list[Mount]:
    """Protect what of the workspace's git metadata the user's own ``git`` would later act on:
    its ``.git`` and that of every submodule ``.gitmodules`` lists (a top-level ``git status``
    goes into each). A ``.git`` directory is pinned (it cannot be renamed or replaced) with what
    steers git (:data:`GIT_READ_ONLY`) bound read-only, or, ``whole``, all of it read-only (a
    call no person approved has no reason to write there); a ``.git`` *file* — a worktree's or
    a submodule's pointer, ``gitdir: …`` — is bound read-only. A submodule's directory and the
    ones above it are pinned too: a directory that holds a mount can still be renamed, and a
    new one put in its place. A ``.git`` that is a symbolic link is left alone (a mount on it
    would land on its target)."""
    mounts: list[Mount] = []
    pinned: set[Path] = set()
    for repo in (workspace, *submodules(workspace)):  # parents before what they hold
        git = repo / ".git"
        if not _plain(git):
            continue
        inner = repo.relative_to(workspace)
        for directory in [*reversed(inner.parents), inner]:
            path = workspace / directory
            if path != workspace and path not in pinned:
                pinned.add(path)
                mounts.append(Mount(os.fspath(path), os.fspath(path), None, MS_BIND))
        locked = locked_flags(git)
        if git.is_file() or whole:
            mounts += _readonly_bind(git, locked, recursive=git.is_dir())
            continue
        target = os.fspath(git)
        mounts.append(Mount(target, target, None, MS_BIND))
        for name in GIT_READ_ONLY:
            path = git / name
            if _plain(path):
                mounts += _readonly_bind(path, locked)
    return mounts


_SUBMODULE_PATH = re.compile(r"^\s*path\s*=\s*(.+?)\s*$", re.MULTILINE)


def submodules(workspace: Path) -> list[Path]:
    """The submodule directories ``<workspace>/.gitmodules`` lists that lie inside the
    workspace with no symbolic link on the way, parents first."""
    try:
        text = (workspace / ".gitmodules").read_text(errors="replace")
    except OSError:
        return []
    found = []
    for raw in _SUBMODULE_PATH.findall(text):
        relative = raw.strip('"')
        path = workspace / relative
        if not relative or os.path.isabs(relative) or _real(path) != path:
            continue
        if path != workspace and is_within(path, workspace) and path.is_dir():
            found.append(path)
    return sorted(set(found), key=lambda p: (len(p.parts), p))


def mask_mounts(
    protected: Iterable[Path], *, readable: tuple[Path, ...], workspace: Path
) -> list[Mount]:
    """Hide each protected path that lies inside a readable or writable tree: a directory under
    an empty read-only ``tmpfs``, a file under ``/dev/null``. A protected path that contains the
    workspace (the data directory holding the default workspace) is left alone: Landlock
    already keeps everything of it but the workspace out of reach."""
    mounts: list[Mount] = []
    if not protected:
        return mounts
    roots = real_roots(readable)
    masked: list[Path] = []
    for path in sorted({_real(p) for p in protected}):  # a parent before what it contains
        if not path.exists() or is_within(workspace, path):
            continue
        if not any(is_within(path, root) for root in roots):
            continue
        if any(is_within(path, done) for done in masked):
            continue  # already hidden under its parent's mount
        masked.append(path)
        target = os.fspath(path)
        if path.is_dir():
            flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            mounts.append(Mount("tmpfs", target, "tmpfs", flags, "size=4k,mode=0555"))
        else:
            mounts.append(Mount("/dev/null", target, None, MS_BIND))
    return mounts
