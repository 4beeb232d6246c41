"""The skills an agent can use, discovered from an ordered list of directories.

Progressive disclosure: :meth:`SkillLibrary.catalogue` (names and descriptions) is always in the
prompt; :meth:`SkillLibrary.body` is read from disk when a skill is triggered; resources are
listed and read one at a time on demand.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nanocrab.skills.errors import SkillError
from nanocrab.skills.loader import load_skill, read_body
from nanocrab.skills.model import SKILL_FILE, Skill
from nanocrab.skills.requires import Missing, Which, missing
from nanocrab.skills.resources import list_resources, read_resource


@dataclass(frozen=True, kw_only=True)
class SkillProblem:
    """A skill that discovery skipped: the file concerned and what to fix."""

    path: Path
    message: str


@dataclass(frozen=True, kw_only=True)
class HiddenSkill:
    """A valid skill left out because this machine lacks what it ``requires``."""

    skill: Skill
    missing: tuple[Missing, ...]


class SkillLibrary:
    """Skills by name. Later skills replace earlier ones with the same name.

    Bodies are read lazily: the first :meth:`body` call for a skill reads its SKILL.md and
    caches the body for the library's lifetime, so an edit made after discovery is seen if it
    lands before that first call and not after it. Discover again to pick up later edits.
    """

    def __init__(
        self,
        skills: Iterable[Skill] = (),
        *,
        problems: Iterable[SkillProblem] = (),
        hidden: Iterable[HiddenSkill] = (),
    ) -> None:
        self._skills: dict[str, Skill] = {}
        for skill in skills:
            self._skills[skill.name] = skill
        self.problems: tuple[SkillProblem, ...] = tuple(problems)
        self.hidden: tuple[HiddenSkill, ...] = tuple(hidden)
        self._bodies: dict[str, str] = {}

    @classmethod
    def discover(
        cls,
        dirs: Sequence[Path],
        *,
        tools: Collection[str] | None = None,
        environ: Mapping[str, str] | None = None,
        which: Which | None = None,
    ) -> SkillLibrary:
        """Load every ``<dir>/<name>/SKILL.md`` in ``dirs``, in order, so later dirs win.

        The runtime passes bundled, user, then workspace directories (see
        :func:`default_skill_dirs`), so a workspace skill overrides a bundled one of the same
        name. Missing directories are skipped. Invalid skills never stop discovery: each is left
        out and recorded in ``problems`` (and an invalid override leaves the earlier skill in
        place). Hidden directories and directories without a SKILL.md are ignored.

        A skill whose ``requires`` this machine does not meet (``nanocrab/skills/requires.py``:
        ``tools``, ``environ`` and ``which`` default to the runtime's tools, ``os.environ`` and
        ``shutil.which``) is left out too, recorded in ``hidden`` with the reasons. A function
        of the files and the machine only: discovering again gives a new library to swap in.
        """
        skills: list[Skill] = []
        problems: list[SkillProblem] = []
        for skills_dir in dirs:
            for skill_dir in _skill_dirs(skills_dir, problems):
                try:
                    skills.append(load_skill(skill_dir))
                except SkillError as exc:
                    path = exc.path or skill_dir / SKILL_FILE
                    problems.append(SkillProblem(path=path, message=exc.message))
        chosen: dict[str, Skill] = {}
        for skill in skills:  # later directories win, as in __init__
            chosen[skill.name] = skill
        usable: list[Skill] = []
        hidden: list[HiddenSkill] = []
        for skill in chosen.values():
            lacking = missing(skill.meta.requires, tools=tools, environ=environ, which=which)
            if lacking:
                hidden.append(HiddenSkill(skill=skill, missing=tuple(lacking)))
            else:
                usable.append(skill)
        return cls(usable, problems=problems, hidden=hidden)

    def __len__(self) -> int:
        return len(self._skills)

    def __contains__(self, name: object) -> bool:
        return name in self._skills

    def names(self) -> list[str]:
        """Skill names, sorted."""
        return sorted(self._skills)

    def get(self, name: str) -> Skill | None:
        return self._skills.get(name)

    def catalogue(self, names: Sequence[str] | None = None) -> str:
        """``- name: description`` lines: metadata only, never a body.

        All skills sorted by name, or ``names`` in the order given (duplicates dropped). Each
        description is folded onto one line. An unknown name raises ``SkillError("not_found")``.
        """
        chosen = self.names() if names is None else list(dict.fromkeys(names))
        unknown = [name for name in chosen if name not in self._skills]
        if unknown:
            raise SkillError(
                "not_found", f"unknown skills {unknown}; available: {self._available()}"
            )
        return "\n".join(
            f"- {name}: {' '.join(self._skills[name].description.split())}" for name in chosen
        )

    def body(self, name: str) -> str:
        """The markdown body of skill ``name``, read on the first call and cached afterwards.

        Raises ``SkillError``: ``not_found`` for an unknown skill, ``invalid_skill`` when its
        SKILL.md no longer parses, ``unreadable`` when it cannot be read.
        """
        skill = self._require(name)
        if name not in self._bodies:
            self._bodies[name] = read_body(skill)
        return self._bodies[name]

    def resources(self, name: str) -> list[str]:
        """Sorted relative paths of skill ``name``'s resource files (see :mod:`.resources`)."""
        return list_resources(self._require(name))

    def resource(self, name: str, relpath: str) -> bytes:
        """The bytes of one resource, read now. Paths leaving the skill raise ``path_escape``."""
        return read_resource(self._require(name), relpath)

    def _require(self, name: str) -> Skill:
        skill = self._skills.get(name)
        if skill is None:
            raise SkillError("not_found", f"no skill {name!r}; available: {self._available()}")
        return skill

    def _available(self) -> str:
        return ", ".join(self.names()) or "(none)"


def bundled_skills_dir() -> Path:
    """The repository's top-level ``skills/`` directory (it may not exist in an installed wheel)."""
    return Path(__file__).resolve().parents[2] / "skills"


def default_skill_dirs(*, workspace: Path | None, user_dir: Path | None) -> list[Path]:
    """Skill directories in precedence order, lowest first, keeping only those that exist.

    Bundled, then ``user_dir`` (the CLI passes ``~/.nanocrab/skills``), then
    ``<workspace>/.nanocrab/skills`` and ``<workspace>/skills``. A directory reached twice (say
    the workspace is this repository) is kept at its first position.
    """
    candidates = [bundled_skills_dir()]
    if user_dir is not None:
        candidates.append(user_dir)
    if workspace is not None:
        candidates += [workspace / ".nanocrab" / "skills", workspace / "skills"]
    dirs: list[Path] = []
    seen: set[str] = set()
    for candidate in candidates:
        real = os.path.realpath(candidate)
        if candidate.is_dir() and real not in seen:
            seen.add(real)
            dirs.append(candidate)
    return dirs


def _skill_dirs(skills_dir: Path, problems: list[SkillProblem]) -> list[Path]:
    """The directories in ``skills_dir`` that hold a SKILL.md, sorted by name."""
    if not skills_dir.is_dir():
        return []
    try:
        children = sorted(skills_dir.iterdir())
    except OSError as exc:
        problems.append(SkillProblem(path=skills_dir, message=f"{skills_dir}: {exc.strerror}"))
        return []
    return [
        child
        for child in children
        if not child.name.startswith(".") and (child / SKILL_FILE).is_file()
    ]
