"""The skills package's one exception, with a typed kind so callers never parse messages."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

SkillErrorKind = Literal[
    "invalid_skill",  # a SKILL.md that does not parse or validate; the message says what to fix
    "not_found",  # no such skill, or no such resource inside a skill
    "path_escape",  # a resource path that leaves the skill's directory
    "unreadable",  # the file exists but could not be read (permissions, I/O)
]


class SkillError(Exception):
    """A skill could not be loaded or a resource could not be served.

    ``message`` names the file or skill and says what to fix; ``path`` is the file concerned
    when there is one.
    """

    def __init__(self, kind: SkillErrorKind, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.kind: SkillErrorKind = kind
        self.message = message
        self.path = path
