"""A skill's resources: the files beside SKILL.md, listed and read without leaving the skill.

Resources are conventionally under ``scripts/``, ``references/`` and ``assets/``; any regular
file in the skill directory other than SKILL.md counts. Containment is decided on real paths
(symlinks resolved) with ``os.path.commonpath``, so ``..``, absolute paths and symlinks that
point outside the skill are all refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from nanocrab.skills.errors import SkillError
from nanocrab.skills.model import SKILL_FILE, Skill

_SKIPPED_NAMES = frozenset({"__pycache__", "node_modules"})


def list_resources(skill: Skill) -> list[str]:
    """Sorted POSIX relative paths of ``skill``'s resource files.

    Hidden entries (``.git``, ``.DS_Store``), ``__pycache__``, ``node_modules`` and symlinks
    resolving outside the skill are left out; symlinked directories are not followed.
    """
    root = os.path.realpath(skill.root)
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if _listed(d)]
        for name in files:
            path = os.path.join(folder, name)
            relpath = Path(os.path.relpath(path, root)).as_posix()
            if _listed(name) and relpath != SKILL_FILE and _inside(root, os.path.realpath(path)):
                found.append(relpath)
    return sorted(found)


def resolve_resource(skill: Skill, relpath: str) -> Path:
    """The real path of the file ``relpath`` names inside ``skill``'s directory.

    Raises :class:`SkillError`: ``path_escape`` for an absolute path or one that resolves
    outside the skill (through ``..`` or a symlink); ``not_found`` when it is not a file.
    """
    root = os.path.realpath(skill.root)
    if not relpath or "\x00" in relpath:
        raise SkillError("not_found", f"skill {skill.name!r}: {relpath!r} is not a resource path")
    if os.path.isabs(relpath):
        raise SkillError(
            "path_escape",
            f"skill {skill.name!r}: {relpath!r} is absolute; give a path relative to the skill, "
            "e.g. 'references/checklist.md'",
        )
    target = os.path.realpath(os.path.join(root, relpath))
    if not _inside(root, target):
        raise SkillError(
            "path_escape", f"skill {skill.name!r}: {relpath!r} resolves outside the skill"
        )
    if not os.path.isfile(target):
        raise SkillError("not_found", f"skill {skill.name!r} has no resource {relpath!r}")
    return Path(target)


def read_resource(skill: Skill, relpath: str) -> bytes:
    """The bytes of a resource; the path rules are :func:`resolve_resource`'s."""
    path = resolve_resource(skill, relpath)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SkillError(
            "unreadable",
            f"skill {skill.name!r}: cannot read {relpath!r}: {exc.strerror}",
            path=path,
        ) from exc


def _listed(name: str) -> bool:
    return not name.startswith(".") and name not in _SKIPPED_NAMES


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root
