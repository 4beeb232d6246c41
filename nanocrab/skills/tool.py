"""The ``skill`` tool: how the model loads a skill's instructions, then its resources, on demand."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from pydantic import Field

from nanocrab.events import SkillDetails, ToolErrorKind
from nanocrab.skills.errors import SkillError, SkillErrorKind
from nanocrab.skills.library import SkillLibrary
from nanocrab.skills.model import Skill
from nanocrab.tools.base import ToolArgs, ToolContext, ToolResult

DEFAULT_MAX_RESOURCE_BYTES = 256 * 1024

_ERROR_KINDS: dict[SkillErrorKind, ToolErrorKind] = {
    "invalid_skill": "failed",
    "not_found": "not_found",
    "path_escape": "path_escape",
    "unreadable": "failed",
}


class SkillArgs(ToolArgs):
    name: str = Field(description="The skill's name, as listed in the available skills.")
    resource: str | None = Field(
        default=None,
        description="A file inside the skill to read, as a relative path from the resource list "
        "the skill returned (e.g. 'references/checklist.md'). Omit to load the instructions.",
    )


class SkillTool:
    """Serves a :class:`SkillLibrary` to the model.

    Without ``resource``: the skill's body, its directory, and the list of its resources;
    details are ``SkillDetails(name, bytes=<body bytes>)``. With ``resource``: that file's text
    (cut at ``max_resource_bytes`` with a note saying so); details are
    ``SkillDetails(name, resource, bytes=<file bytes>)``. Failures are typed results: an unknown
    skill is ``not_found`` listing the available names, a missing resource ``not_found`` listing
    the skill's resources, an escaping path ``path_escape``, a binary file ``failed``.
    """

    name: ClassVar[str] = "skill"
    group: ClassVar[str] = "skills"
    description: ClassVar[str] = (
        "Load a skill's instructions by name before doing a task that one of the available "
        "skills covers, then follow them. The result lists the skill's resource files "
        "(references, scripts, assets); pass one as `resource` to read it when the "
        "instructions point to it."
    )
    args_model: ClassVar[type[ToolArgs]] = SkillArgs
    idempotent: ClassVar[bool] = True  # reads skill content only: re-run after a crash

    def __init__(
        self, library: SkillLibrary, *, max_resource_bytes: int = DEFAULT_MAX_RESOURCE_BYTES
    ) -> None:
        self._library = library
        self._max_resource_bytes = max_resource_bytes

    async def run(self, args: SkillArgs, ctx: ToolContext) -> ToolResult:
        """Never raises for an expected failure; see the class docstring for the results."""
        skill = self._library.get(args.name)
        if skill is None:
            available = ", ".join(self._library.names()) or "(none)"
            return ToolResult.error(
                "not_found", f"No skill named {args.name!r}. Available skills: {available}."
            )
        try:
            if args.resource is None:
                return await asyncio.to_thread(self._instructions, skill)
            return await asyncio.to_thread(self._resource, skill, args.resource)
        except SkillError as exc:
            return ToolResult.error(_ERROR_KINDS[exc.kind], exc.message)

    def _instructions(self, skill: Skill) -> ToolResult:
        name = skill.name
        body = self._library.body(name)
        resources = self._library.resources(name)
        parts = [f"# Skill: {name}", f"Directory: {skill.root}", "", body]
        if resources:
            parts += [
                "",
                "## Resources",
                f'Read one with skill(name="{name}", resource="<path>"); '
                "scripts can also be run from the directory above.",
                *(f"- {path}" for path in resources),
            ]
        return ToolResult.text(
            "\n".join(parts), details=SkillDetails(name=name, bytes=len(body.encode()))
        )

    def _resource(self, skill: Skill, relpath: str) -> ToolResult:
        name = skill.name
        try:
            data = self._library.resource(name, relpath)
        except SkillError as exc:
            if exc.kind != "not_found":
                raise
            listed = ", ".join(self._library.resources(name)) or "(none)"
            return ToolResult.error("not_found", f"{exc.message}. Its resources: {listed}.")
        details = SkillDetails(name=name, resource=relpath, bytes=len(data))
        if b"\x00" in data or not _is_utf8(data):
            return ToolResult.error(
                "failed",
                f"{relpath!r} in skill {name!r} is a binary file ({len(data)} bytes), not text; "
                f"use it by path: {skill.root / relpath}",
                details=details,
            )
        limit = self._max_resource_bytes
        if len(data) <= limit:
            return ToolResult.text(data.decode(), details=details)
        shown = data[:limit].decode(errors="ignore")
        note = f"\n\n[truncated: showed the first {limit} of {len(data)} bytes of {relpath}]"
        return ToolResult.text(shown + note, details=details)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True
