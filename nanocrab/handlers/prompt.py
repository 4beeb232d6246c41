"""The system prompt: the agent profile, the workspace, the runtime tool catalogue (only the
tools enabled for this run) and the skills catalogue (names and descriptions only)."""

from __future__ import annotations

from pathlib import Path

from nanocrab.agents import profile
from nanocrab.events import MemoryRecalled, TaskSubmitted
from nanocrab.skills import SkillLibrary
from nanocrab.tools.registry import ToolRegistry


def system_prompt(
    task: TaskSubmitted,
    *,
    tools: list[str],
    workspace: Path,
    registry: ToolRegistry,
    skills: SkillLibrary | None,
    agent: str | None = None,
    recalled: MemoryRecalled | None = None,
    config: str | None = None,
) -> str:
    """``agent``: the run's agent as started (routed), else the task's; ``recalled``: similar
    earlier work the router found (``memory.recalled``), listed for the model; ``config``: the
    run's configuration version, whose agent profile gives the prompt (``None``: start-up)."""
    prof = profile(agent or task.agent, config)
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
    if recalled is not None and recalled.texts:
        parts.append(
            "## Memory\nEarlier work similar to this task (id, similarity, what happened); use "
            "it if it helps:\n" + "\n".join(f"- {t}" for t in recalled.texts)
        )
    return "\n\n".join(parts)
