"""Skills: SKILL.md bundles of instructions and resources, disclosed progressively.

The catalogue (name and description) is always in the prompt; a skill's body is read when the
model loads it with the ``skill`` tool; its resources are read one at a time on demand.
"""

from nanocrab.skills.errors import SkillError, SkillErrorKind
from nanocrab.skills.library import (
    HiddenSkill,
    SkillLibrary,
    SkillProblem,
    bundled_skills_dir,
    default_skill_dirs,
)
from nanocrab.skills.loader import load_skill, parse_skill_text, read_body
from nanocrab.skills.model import (
    MAX_DESCRIPTION_CHARS,
    MAX_NAME_CHARS,
    SKILL_FILE,
    Skill,
    SkillMeta,
)
from nanocrab.skills.resources import list_resources, read_resource, resolve_resource
from nanocrab.skills.tool import SkillArgs, SkillTool

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "MAX_NAME_CHARS",
    "SKILL_FILE",
    "HiddenSkill",
    "Skill",
    "SkillArgs",
    "SkillError",
    "SkillErrorKind",
    "SkillLibrary",
    "SkillMeta",
    "SkillProblem",
    "SkillTool",
    "bundled_skills_dir",
    "default_skill_dirs",
    "list_resources",
    "load_skill",
    "parse_skill_text",
    "read_body",
    "read_resource",
    "resolve_resource",
]
