"""The environment a confined command gets: built from an allow-list, never inherited whole.

Passed through from the runtime when set: ``LANG``, ``LANGUAGE``, ``LC_*``, ``TZ``, ``TERM``,
``COLUMNS``, ``NO_COLOR`` and the names the policy lists (``exec.env``). Set by the sandbox:
``HOME`` and ``TMPDIR`` (the call's private temporary directory), ``USER``/``LOGNAME`` (the
runtime's user name), ``SHELL=/bin/sh`` and ``PATH``: the runtime's ``PATH`` without the
entries the sandbox cannot read (relative ones, ``~/.local/bin``, pyenv shims …), with the
runtime interpreter's own directory in place of the first entry dropped (or at the end), so
``python3`` still finds an interpreter whose packages the sandbox can read.

A name that looks like a secret is never passed, whatever the policy says: see
:func:`secret_like`.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import pwd
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

PASSED = ("LANG", "LANGUAGE", "LC_*", "TZ", "TERM", "COLUMNS", "NO_COLOR")
SECRET_PATTERNS = (
    "ANTHROPIC_*", "OPENAI_*", "NANOCRAB_*", "AWS_*", "AZURE_*", "GOOGLE_*", "GCP_*",
    "GITHUB_*", "GH_*", "GITLAB_*", "NATS_*", "SSH_*", "GPG_*", "GNUPG*",
    "*TOKEN*", "*SECRET*", "*KEY*", "*PASSWORD*", "*PASSWD*", "*CREDENTIAL*", "*AUTH*",
    "*COOKIE*", "*SESSION*", "*PRIVATE*", "*_PAT", "*DSN*", "DATABASE_URL",
)  # fmt: skip
"""Variable names (``fnmatch``, case-insensitive) the sandbox never passes to a command."""


def secret_like(name: str) -> bool:
    """Whether ``name`` looks like it carries a credential (see :data:`SECRET_PATTERNS`)."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_PATTERNS)


def _inside(path: str, roots: Iterable[Path]) -> bool:
    return any(path == str(root) or path.startswith(str(root).rstrip("/") + "/") for root in roots)


@functools.lru_cache(maxsize=64)
def sandbox_path(runtime_path: str, readable: tuple[Path, ...], own: str) -> str:
    """``runtime_path`` keeping only absolute entries whose real path lies in ``readable``, with
    ``own`` (the runtime interpreter's directory) where the first entry was dropped, or at the
    end; ``own`` is left out when it is not readable either."""
    roots = [Path(os.path.realpath(r)) for r in readable]
    kept: list[str] = []
    own_at: int | None = None
    for entry in runtime_path.split(os.pathsep):
        if os.path.isabs(entry) and _inside(os.path.realpath(entry), roots):
            if entry not in kept:
                kept.append(entry)
        elif own_at is None:
            own_at = len(kept)
    if own not in kept and _inside(os.path.realpath(own), roots):
        kept.insert(len(kept) if own_at is None else own_at, own)
    return os.pathsep.join(kept)


def build_env(
    runtime: Mapping[str, str],
    *,
    extra: Iterable[str],
    home: Path,
    readable: tuple[Path, ...],
) -> dict[str, str]:
    """The child's environment, from the runtime's (``runtime``) and the allow-list."""
    wanted = (*PASSED, *extra)
    env = {
        name: value
        for name, value in runtime.items()
        if any(fnmatch.fnmatchcase(name, p) for p in wanted) and not secret_like(name)
    }
    user = _user_name(os.geteuid())
    env.update(
        HOME=str(home),
        TMPDIR=str(home),
        USER=user,
        LOGNAME=user,
        SHELL="/bin/sh",
        PATH=sandbox_path(
            runtime.get("PATH", os.defpath), readable, os.path.dirname(sys.executable)
        ),
    )
    return env


@functools.lru_cache(maxsize=8)
def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
