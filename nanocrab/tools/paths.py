"""Where a tool may touch: paths confined to the run's workspace, and what went wrong touching them.

Containment is decided on real paths (every symlink resolved, also for targets that do not exist
yet) with ``os.path.commonpath``, never by string prefix: ``/work/ws-evil`` is not inside
``/work/ws``, and ``link -> /etc`` is outside however it is spelled.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from nanocrab.tools.base import ToolError


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """The real path ``path`` names, which is guaranteed to lie inside ``workspace``.

    Relative paths are joined to the workspace; absolute paths are accepted only when they
    resolve inside it. Raises ``ToolError("invalid_arguments")`` for an empty path or a NUL
    byte and ``ToolError("path_escape")`` when the resolved path is outside the workspace.
    """
    if not path or not path.strip():
        raise ToolError("invalid_arguments", "The path is empty; give a path inside the workspace.")
    if "\x00" in path:
        raise ToolError("invalid_arguments", f"The path {path!r} contains a NUL byte.")
    root = os.path.realpath(workspace)
    target = os.path.realpath(os.path.join(root, path))
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
    """Whether ``path`` (typically a symlink met while walking) resolves inside ``workspace``."""
    return is_inside(os.path.realpath(workspace), os.path.realpath(path))


def display_path(workspace: Path, resolved: Path) -> str:
    """``resolved`` as the model should name it: relative to the workspace, ``/``-separated."""
    rel = os.path.relpath(resolved, os.path.realpath(workspace))
    return Path(rel).as_posix()


def os_error(exc: OSError, shown: str) -> ToolError:
    """Translate an ``OSError`` from an operations backend into a typed tool failure."""
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return not_found(shown)
    if isinstance(exc, IsADirectoryError):
        return ToolError("invalid_arguments", f"{shown} is a directory; use ls to list it.")
    if isinstance(exc, PermissionError):
        return ToolError("failed", f"Permission denied for {shown}.")
    reason = exc.strerror or errno.errorcode.get(exc.errno or 0, "") or str(exc)
    return ToolError("failed", f"Could not access {shown}: {reason}.")


def not_found(shown: str) -> ToolError:
    """The failure for a path that does not exist, pointing the model at ls and glob."""
    return ToolError("not_found", f"{shown} does not exist. Use ls or glob to find the right path.")
