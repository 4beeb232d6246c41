"""The system prompt: the agent profile, the workspace, the runtime tool catalogue (only the
tools enabled for this run) and the skills catalogue (names and descriptions only)."""

from __future__ import annotations

from pathlib import Path

from nanocrab.agents import profile
from nanocrab.events import TaskSubmitted
from nanocrab.skills import SkillLibrary
from nanocrab.tools.registry import ToolRegistry


def system_prompt(
    task: TaskSubmitted,
    *,
    tools: list[str],
    workspace: Path,
    registry: ToolRegistry,
    skills: SkillLibrary | None,
) -> str:
    prof = profile(task.agent)
    parts = [
        prof.system_prompt,
        f"Workspace: {workspace}\nPaths are relative to it; nothing outside it is reachable.",
        "## Tools\n" + registry.catalogue(tools),
    ]
    if skills is not None and skills.names() and "skill" in tools:
        parts.append(
            "## Skills\nLoad a skill's instructions with the `skill` tool when it fits the task.\n"
            + skills.catalogue()
        )
    preload = [*prof.skills, *task.skills]
    if skills is not None:
        for name in dict.fromkeys(preload):
            if skills.get(name) is not None:
                parts.append(f"## Skill: {name}\n{skills.body(name)}")
    return "\n\n".join(parts)
