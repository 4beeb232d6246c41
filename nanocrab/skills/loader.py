"""Reading SKILL.md: split the frontmatter from the body, parse it, validate it.

Discovery reads only the frontmatter (:func:`load_skill`); the body is read separately
(:func:`read_body`) when a skill is triggered. Every failure is a :class:`SkillError` whose
message names the file and says what to fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import yaml
from pydantic import ValidationError

from nanocrab.skills.errors import SkillError
from nanocrab.skills.model import SKILL_FILE, Skill, SkillMeta

MAX_FRONTMATTER_BYTES = 64 * 1024
_DELIMITER = "---"

_MISSING = {
    "name": "missing: add 'name: <the directory name>'",
    "description": "missing: add a description saying what the skill does and when to use it",
}


def load_skill(skill_dir: Path) -> Skill:
    """Load the skill in ``skill_dir`` from its SKILL.md frontmatter, without reading the body.

    The frontmatter's ``name`` must equal ``skill_dir.name`` (the name the directory has where it
    was found, even if it is a symlink). ``Skill.root`` is the directory's resolved real path.
    """
    file = skill_dir / SKILL_FILE
    with _reading(file), file.open("rb") as raw:
        meta = _parse_meta(_frontmatter(_decoded(raw), file), file)
    if meta.name != skill_dir.name:
        raise SkillError(
            "invalid_skill",
            f"{file}: name {meta.name!r} does not match the directory name {skill_dir.name!r}; "
            "rename one of them so they are equal",
            path=file,
        )
    return Skill(meta=meta, root=skill_dir.resolve())


def read_body(skill: Skill) -> str:
    """Read ``skill``'s SKILL.md now and return its body (surrounding blank lines stripped).

    The whole file is parsed again, so a SKILL.md broken since discovery raises
    :class:`SkillError` rather than serving half a skill; so does a changed ``name``.
    """
    file = skill.file
    with _reading(file):
        text = file.read_text(encoding="utf-8-sig")
    meta, body = parse_skill_text(text, file=file)
    if meta.name != skill.name:
        raise SkillError(
            "invalid_skill",
            f"{file}: name changed from {skill.name!r} to {meta.name!r} since discovery",
            path=file,
        )
    return body


def parse_skill_text(text: str, *, file: Path) -> tuple[SkillMeta, str]:
    """Parse a whole SKILL.md: validated frontmatter and the stripped markdown body.

    ``file`` is used only in error messages. The directory-name check is the caller's.
    """
    lines = iter(text.splitlines(keepends=True))
    meta = _parse_meta(_frontmatter(lines, file), file)
    return meta, "".join(lines).strip()


@contextmanager
def _reading(file: Path) -> Iterator[None]:
    """Translate the errors of reading ``file`` into :class:`SkillError`."""
    try:
        yield
    except FileNotFoundError as exc:
        raise SkillError("not_found", f"{file}: no such file", path=file) from exc
    except UnicodeDecodeError as exc:
        raise SkillError(
            "invalid_skill", f"{file}: not UTF-8 text ({exc.reason})", path=file
        ) from exc
    except OSError as exc:
        raise SkillError("unreadable", f"{file}: cannot read: {exc.strerror}", path=file) from exc


def _decoded(raw: BinaryIO) -> Iterator[str]:
    """Decode UTF-8 line by line, so bytes past the frontmatter are never decoded."""
    for number, line in enumerate(raw):
        yield line.decode("utf-8-sig" if number == 0 else "utf-8")


def _frontmatter(lines: Iterator[str], file: Path) -> str:
    """Consume lines up to and including the closing delimiter; return the YAML between."""
    first = next(lines, "")
    if first.rstrip() != _DELIMITER:
        raise SkillError(
            "invalid_skill",
            f"{file}: no YAML frontmatter: the file must start with a '---' line, then YAML with "
            "at least name and description, then a closing '---' line",
            path=file,
        )
    block: list[str] = []
    size = 0
    for line in lines:
        if line.rstrip() == _DELIMITER:
            return "".join(block)
        size += len(line.encode())
        if size > MAX_FRONTMATTER_BYTES:
            raise SkillError(
                "invalid_skill",
                f"{file}: the frontmatter is longer than {MAX_FRONTMATTER_BYTES // 1024} KiB "
                "(or its closing '---' line is missing): keep it to the metadata",
                path=file,
            )
        block.append(line)
    raise SkillError(
        "invalid_skill",
        f"{file}: the frontmatter is not closed: add a '---' line after the YAML",
        path=file,
    )


def _parse_meta(source: str, file: Path) -> SkillMeta:
    try:
        data = yaml.safe_load(source)
    except yaml.YAMLError as exc:
        raise SkillError("invalid_skill", f"{file}: {_yaml_problem(exc)}", path=file) from exc
    if not isinstance(data, dict):
        raise SkillError(
            "invalid_skill",
            f"{file}: the frontmatter must be a YAML mapping with at least name and description",
            path=file,
        )
    try:
        return SkillMeta.model_validate(data)
    except ValidationError as exc:
        raise SkillError(
            "invalid_skill", f"{file}: invalid frontmatter: {_validation_problems(exc)}", path=file
        ) from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    where = ""
    problem = str(exc)
    if isinstance(exc, yaml.MarkedYAMLError):
        problem = exc.problem or exc.context or problem
        if exc.problem_mark is not None:
            where = f" at line {exc.problem_mark.line + 2}"  # the YAML starts on the file's line 2
    return (
        f"invalid YAML in the frontmatter{where}: {problem}; "
        "quote values that contain ': ' or start with a special character"
    )


def _validation_problems(exc: ValidationError) -> str:
    accepted = ", ".join(SkillMeta.model_fields)
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "frontmatter"
        if error["type"] == "missing":
            message = _MISSING.get(field, "missing")
        elif error["type"] == "extra_forbidden":
            message = f"unknown key; the accepted keys are {accepted}"
        else:
            message = error["msg"]
        problems.append(f"{field}: {message}")
    return "; ".join(problems)
