"""What a skill is: validated SKILL.md frontmatter plus the directory it lives in.

A skill is a directory holding ``SKILL.md``: YAML frontmatter between ``---`` lines, then a
markdown body of instructions. Any other file in the directory (conventionally under
``scripts/``, ``references/`` and ``assets/``) is a resource, read only on demand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

SKILL_FILE = "SKILL.md"
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024

_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


class SkillMeta(BaseModel):
    """The frontmatter of a SKILL.md. Unknown keys are rejected so a typo is not silently lost.

    ``name``: lowercase letters, digits and single hyphens, at most 64 characters; the loader
    also requires it to equal the directory name. ``description``: what the skill does and when
    to use it, at most 1024 characters; it is all the model sees until it loads the skill.
    ``requires``: tools or binaries the skill needs (a single string is taken as a one-item list).
    ``metadata``: an opaque mapping for other tools (the Agent Skills convention); never read here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    requires: tuple[str, ...] = ()
    license: str | None = None
    version: str | None = None
    metadata: dict[str, object] = Field(default_factory=dict)

    @field_validator("name", mode="before")
    @classmethod
    def _check_name(cls, value: object) -> object:
        if not isinstance(value, str):
            raise PydanticCustomError("skill_name", "must be a string")
        if len(value) > MAX_NAME_CHARS:
            raise PydanticCustomError(
                "skill_name",
                "{name!r} is {n} characters long; the limit is {limit}",
                {"name": value, "n": len(value), "limit": MAX_NAME_CHARS},
            )
        if not _NAME.fullmatch(value):
            raise PydanticCustomError(
                "skill_name",
                "{name!r} is not a valid skill name: use lowercase letters, digits and single "
                "hyphens (not at the start or end), e.g. 'code-review'",
                {"name": value},
            )
        return value

    @field_validator("description", mode="before")
    @classmethod
    def _check_description(cls, value: object) -> object:
        if not isinstance(value, str) or not value.strip():
            raise PydanticCustomError(
                "skill_description",
                "must be a non-empty string saying what the skill does and when to use it",
            )
        text = value.strip()
        if len(text) > MAX_DESCRIPTION_CHARS:
            raise PydanticCustomError(
                "skill_description",
                "is {n} characters long; the limit is {limit}: move detail into the body",
                {"n": len(text), "limit": MAX_DESCRIPTION_CHARS},
            )
        return text

    @field_validator("requires", mode="before")
    @classmethod
    def _one_requirement(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("version", mode="before")
    @classmethod
    def _quoted_version(cls, value: object) -> object:
        if value is not None and not isinstance(value, str):
            raise PydanticCustomError(
                "skill_version",
                'must be a string; quote it in YAML, e.g. version: "{value}"',
                {"value": str(value)},
            )
        return value


@dataclass(frozen=True, kw_only=True)
class Skill:
    """A discovered skill: its metadata and its directory (a resolved real path).

    The body is not held here; :class:`~nanocrab.skills.library.SkillLibrary` reads it from
    ``file`` when first asked (progressive disclosure).
    """

    meta: SkillMeta
    root: Path

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def description(self) -> str:
        return self.meta.description

    @property
    def file(self) -> Path:
        return self.root / SKILL_FILE
