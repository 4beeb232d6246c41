"""The task-type → skills mapping: which skills fit which kind of task.

``skillmap.yaml`` (``NANOCRAB_SKILLMAP``, else ``<home>/skillmap.yaml``, else the bundled
``nanocrab/skills/skillmap.yaml`` for the bundled skills)::

    version: 1
    threshold: 0.2          # a type applies when the task scores at least this ...
    margin: 0.03            # ... and leads the runner-up by at least this
    types:
      - name: debugging
        description: Find and fix the cause of a crash, an exception or a failing test.
        examples: ["the tests fail with a KeyError since this morning"]
        skills: [python-debugging]

A task's score for a type is its mean cosine similarity to the type's description and examples
(as the router scores agents, ``nanocrab/routing.py``); ``get_skills_for_task`` answers the
best type's skills first, then the library's other skills by similarity of their descriptions.
Errors name the file and line (:class:`SkillMapError`), like the other configuration files.
A skill the map names that the library does not have (missing, invalid or hidden for its
``requires``) is left out of answers and reported by ``nanocrab skills check``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nanocrab.yamlfile import parse_model

BUNDLED = Path(__file__).with_name("skillmap.yaml")


class SkillMapError(Exception):
    """``skillmap.yaml`` is unreadable or invalid; the message names the file and line."""


class TaskType(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$")
    description: str = Field(min_length=1)
    examples: tuple[str, ...] = ()
    skills: tuple[str, ...] = Field(min_length=1)


class SkillMap(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    threshold: float = Field(default=0.2, ge=-1.0, le=1.0)
    margin: float = Field(default=0.03, ge=0.0, le=2.0)
    types: tuple[TaskType, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> SkillMap:
        names = [t.name for t in self.types]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"task type names must be unique: {dup}")
        return self

    def unknown_skills(self, known: set[str] | frozenset[str]) -> dict[str, list[str]]:
        """Per type, the skills it names that are not in ``known``."""
        out = {t.name: [s for s in t.skills if s not in known] for t in self.types}
        return {k: v for k, v in out.items() if v}


def skillmap_file(home: Path, environ: Mapping[str, str]) -> Path:
    """``NANOCRAB_SKILLMAP`` if set, else ``<home>/skillmap.yaml`` if it exists, else the
    bundled map."""
    named = environ.get("NANOCRAB_SKILLMAP")
    if named:
        return Path(named)
    path = home / "skillmap.yaml"
    return path if path.is_file() else BUNDLED


def load_skillmap(path: Path) -> SkillMap:
    """The map in ``path``; :class:`SkillMapError` with ``file:line`` when it is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SkillMapError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_skillmap(text, str(path))


def parse_skillmap(text: str, source: str = "<skillmap.yaml>") -> SkillMap:
    return parse_model(
        text, source, SkillMap, SkillMapError, what="skill maps",
        shape="a skill map is a mapping with 'version: 1' and 'types'",
    )  # fmt: skip
