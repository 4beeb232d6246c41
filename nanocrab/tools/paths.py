"""Where a tool may touch: paths confined to the run's workspace, and what went wrong touching them.

Two checks, at two moments. A tool first resolves its argument with :func:`resolve_in_workspace`:
containment decided on real paths (every symlink resolved, also for targets that do not exist
yet) with ``os.path.commonpath``, never by string prefix: ``/work/ws-evil`` is not inside
``/work/ws``, and ``link -> /etc`` is outside however it is spelled. That answer is only true when
it is given: a concurrent process (or a parallel call) may swap a directory or file for a symlink
before the path is opened. So the operations backend opens every path again with
:func:`beneath`, which is what makes the check hold at the moment of use.

:func:`beneath` walks the path one component at a time from a descriptor of the workspace,
opening each directory with ``O_NOFOLLOW | O_DIRECTORY`` relative to its parent and acting on
the last component through its parent's descriptor (``openat``, ``fstatat``, ``renameat``…). The
kernel never follows a symlink for it: a link met on the way is read (``readlinkat``) and its
target spliced into the walk, where ``..`` climbs the descriptors actually opened, never above
the workspace's; an absolute target must name a place inside the workspace. At most
:data:`MAX_LINKS` links per resolution. A link leading out is refused with :class:`PathEscape`,
and so is a relative one that climbs out and back in (``../ws/x``), which the first check lets
through: a walk that never leaves the workspace cannot vouch for what it would cross outside.

Why not ``openat2(RESOLVE_BENEATH)`` (Linux 5.6+, no Python binding, reachable through ctypes): it
answers only ``open``, while the backend also needs the parent directory's descriptor to create,
stat, list and rename (an atomic write is a temporary file renamed over the target in the same
directory); it rejects *every* absolute symlink, also one naming a place inside the workspace,
which ``resolve_in_workspace`` accepts; and container seccomp profiles often fail it with
``ENOSYS``, so the component walk would be needed as a fallback anyway. One code path, the one
that always runs, is the one that is tested. The walk costs one ``openat``/``close`` pair per
directory level: a ``read`` call (a stat and a read, each walked) of a file two directories down
went from 57 to 75 µs p50 on the development machine.

Not covered: hard links (a name in the workspace for a file outside it is that file, whichever
name opens it) and mount points inside the workspace.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nanocrab.tools.base import ToolError

T = TypeVar("T")

MAX_LINKS = 40
"""Symlinks one :func:`beneath` resolution follows before giving up with ``ELOOP`` (the kernel's
own limit); a retry after a concurrent swap counts as one."""

_MAX_MADE = 2048  # directories one resolution may create (PATH_MAX / 2 components)
# Directories on the way are only searched: O_PATH (Linux) opens them without read permission
# and a little faster; elsewhere a read-only open does.
_SEARCH = getattr(os, "O_PATH", os.O_RDONLY)
_DIR_FLAGS = _SEARCH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ROOT_FLAGS = _SEARCH | os.O_DIRECTORY | os.O_CLOEXEC


class PathEscape(PermissionError):
    """Opening a path would leave the workspace: a symlink met on the way points outside it, or
    ``..`` climbs above it. ``filename`` is the path as given to the backend."""


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """The real path ``path`` names, which lies inside ``workspace`` (when this answers: the
    backend checks again when it opens the path).

    Relative paths are joined to the workspace; absolute paths are accepted only when they
    resolve inside it. Raises ``ToolError("invalid_arguments")`` for an empty path or a NUL
    byte, ``ToolError("path_escape")`` when the resolved path is outside the workspace, and
    ``ToolError("failed")`` when the path kept changing while it was being resolved.
    """
    if not path or not path.strip():
        raise ToolError("invalid_arguments", "The path is empty; give a path inside the workspace.")
    if "\x00" in path:
        raise ToolError("invalid_arguments", f"The path {path!r} contains a NUL byte.")
    root = os.path.realpath(workspace)
    target = _realpath(os.path.join(root, path))
    if target is None:
        raise ToolError(
            "failed", f"Path {path!r} kept changing while it was being resolved; try again."
        )
    if not is_inside(root, target):
        raise ToolError(
            "path_escape",
            f"Path {path!r} resolves outside the workspace {root}; "
            "only paths inside the workspace are allowed (relative paths are joined to it).",
        )
    return Path(target)


def is_inside(root: str, target: str) -> bool:
    """Whether the absolute real path ``target`` is ``root`` or lies below it."""
    try:
        return os.path.commonpath([root, target]) == root
    except ValueError:
        return False


def link_stays_inside(workspace: Path, path: Path) -> bool:
    """Whether ``path`` (typically a symlink met while walking) resolves inside ``workspace``;
    ``False`` when it changed too often to tell."""
    target = _realpath(os.fspath(path))
    return target is not None and is_inside(os.path.realpath(workspace), target)


def _realpath(path: str, attempts: int = 3) -> str | None:
    """``os.path.realpath``, which raises (``EINVAL`` from ``readlink``) when a symlink it met
    is replaced before it reads it; retried, ``None`` if it keeps happening."""
    for _ in range(attempts):
        try:
            return os.path.realpath(path)
        except OSError:
            continue
    return None


def display_path(workspace: Path, resolved: Path) -> str:
    """``resolved`` as the model should name it: relative to the workspace, ``/``-separated."""
    rel = os.path.relpath(resolved, os.path.realpath(workspace))
    return Path(rel).as_posix()


def os_error(exc: OSError, shown: str) -> ToolError:
    """Translate an ``OSError`` from an operations backend into a typed tool failure."""
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return not_found(shown)
    if isinstance(exc, PathEscape):
        return ToolError(
            "path_escape",
            f"{shown} leads outside the workspace through a symbolic link (checked when it was "
            "opened); only paths inside the workspace are allowed.",
        )
    if isinstance(exc, IsADirectoryError):
        return ToolError("invalid_arguments", f"{shown} is a directory; use ls to list it.")
    if isinstance(exc, PermissionError):
        return ToolError("failed", f"Permission denied for {shown}.")
    reason = exc.strerror or errno.errorcode.get(exc.errno or 0, "") or str(exc)
    return ToolError("failed", f"Could not access {shown}: {reason}.")


def not_found(shown: str) -> ToolError:
    """The failure for a path that does not exist, pointing the model at ls and glob."""
    return ToolError("not_found", f"{shown} does not exist. Use ls or glob to find the right path.")


LastStep = Callable[[int, str, tuple[str, ...]], T]
"""What :func:`beneath` does with the last component: ``final(dir_fd, name, parts)`` where
``dir_fd`` is the directory holding ``name`` (``"."`` for that directory itself) and ``parts``
the real components from the workspace to it. It must not follow a symlink at ``name`` (use
``O_NOFOLLOW`` / ``follow_symlinks=False``) and raises ``OSError(ELOOP)`` when it meets one, or
``ENOTDIR`` from an ``O_DIRECTORY`` open: :func:`beneath` then follows the link itself."""


def beneath(workspace: Path, path: Path | str, final: LastStep[T], *, make_dirs: bool = False) -> T:
    """``final`` applied to the last component of ``path``, reached from ``workspace`` without
    ever leaving it, whatever the tree looks like at that moment.

    ``path`` is absolute (inside ``workspace`` or its real path) or relative to ``workspace``.
    Symlinks on the way, the last component's included, are followed only while they stay inside
    (the module docstring says how); ``make_dirs`` creates missing directories before the last
    component. Raises :class:`PathEscape` for a path or link leading out, ``OSError(ELOOP)`` past
    :data:`MAX_LINKS`, and the ``OSError`` of the failing call otherwise (``FileNotFoundError``,
    ``NotADirectoryError``…). The workspace's own path is trusted (it may contain symlinks).
    """
    root = os.fspath(workspace)
    given = os.fspath(path)
    pending = _components(root, given, repr(given))
    fds = [os.open(root, _ROOT_FLAGS)]
    names: list[str] = []
    budget = MAX_LINKS
    made = 0
    via = repr(given)  # what a refusal names: the path, or the last symlink spliced in
    try:
        while True:
            name = pending.pop() if pending else "."
            if name == "..":
                if not names:
                    raise PathEscape(errno.EPERM, f"{via} climbs above the workspace", given)
                os.close(fds.pop())
                names.pop()
                name = "."
            if name in ("", "."):
                if pending:
                    continue
                name = "."
            try:
                if not pending:
                    return final(fds[-1], name, tuple(names))
                fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
                names.append(name)
                continue
            except FileNotFoundError:
                if not (make_dirs and pending):
                    raise
                try:
                    os.mkdir(name, dir_fd=fds[-1])
                except FileExistsError:
                    pass  # made concurrently: open it (a retry, below) like any other
                else:
                    made += 1
                    if made > _MAX_MADE:
                        raise OSError(errno.ELOOP, "too many directories to create", given)
                    pending.append(name)  # now open it; a new directory costs no budget
                    continue
                target = None
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                target = _link_target(fds[-1], name, exc)
            budget -= 1
            if budget < 0:
                raise OSError(errno.ELOOP, f"more than {MAX_LINKS} symlinks or retries", given)
            if target is None:  # retry the same component
                pending.append(name)
            else:
                via = f"the symlink {'/'.join([*names, name])!r} -> {target!r}"
                if target.startswith("/"):
                    pending.extend(_components(root, target, via))
                    for fd in fds[1:]:
                        os.close(fd)
                    del fds[1:], names[:]
                else:
                    pending.extend(reversed(target.split("/")))
    finally:
        for fd in fds:
            os.close(fd)


def _components(root: str, path: str, what: str) -> list[str]:
    """``path``'s components below ``root``, last first (a stack to pop), or
    :class:`PathEscape` when an absolute ``path`` is not under ``root`` nor its real path."""
    if not os.path.isabs(path):
        return path.split("/")[::-1]
    rest = _below(root, path)
    if rest is None:  # spelled from the workspace's real path rather than the one given
        rest = _below(os.path.realpath(root), path)
    if rest is None:
        raise PathEscape(errno.EPERM, f"{what} leads outside the workspace {root}", path)
    return rest


def _below(base: str, path: str) -> list[str] | None:
    if path == base:
        return []
    prefix = base.rstrip("/") + "/"
    if not path.startswith(prefix):
        return None
    return path[len(prefix) :].split("/")[::-1]


def _link_target(dir_fd: int, name: str, met: OSError) -> str | None:
    """The target of the symlink ``name`` (which made the call fail with ``met``), ``None``
    when it is no longer a link so the call is worth retrying, or ``met`` re-raised when
    ``name`` is simply not a directory."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.EINVAL and met.errno == errno.ELOOP:
            return None
        if exc.errno == errno.EINVAL:
            raise met from None
        raise
