"""The skill library as a run sees it: the library of the run's pinned configuration version.

:class:`VersionedSkills` is a :class:`~nanocrab.skills.SkillLibrary` whose every read goes to
the library of the version pinned in the current context (:func:`~nanocrab.reload.pinned`,
set by the handler working for a run), else the active one. The ``skill`` tool, the skills
catalogue of the prompt and ``skills_for_task`` take it in place of a discovered library, so
swapping versions swaps whole library objects and never touches one in use.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanocrab.reload.view import ConfigView
from nanocrab.skills import HiddenSkill, Skill, SkillLibrary, SkillProblem


class VersionedSkills(SkillLibrary):
    def __init__(self, view: ConfigView) -> None:
        super().__init__()
        self.view = view

    @property
    def library(self) -> SkillLibrary:
        return self.view.pinned().skills

    @property
    def problems(self) -> tuple[SkillProblem, ...]:
        return self.library.problems

    @problems.setter
    def problems(self, _value: tuple[SkillProblem, ...]) -> None:
        """Set by the base class's constructor; a versioned library has none of its own."""

    @property
    def hidden(self) -> tuple[HiddenSkill, ...]:
        return self.library.hidden

    @hidden.setter
    def hidden(self, _value: tuple[HiddenSkill, ...]) -> None:
        """Set by the base class's constructor; a versioned library has none of its own."""

    def __len__(self) -> int:
        return len(self.library)

    def __contains__(self, name: object) -> bool:
        return name in self.library

    def names(self) -> list[str]:
        return self.library.names()

    def get(self, name: str) -> Skill | None:
        return self.library.get(name)

    def catalogue(self, names: Sequence[str] | None = None) -> str:
        return self.library.catalogue(names)

    def body(self, name: str) -> str:
        return self.library.body(name)

    def resources(self, name: str) -> list[str]:
        return self.library.resources(name)

    def resource(self, name: str, relpath: str) -> bytes:
        return self.library.resource(name, relpath)
