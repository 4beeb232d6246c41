"""``get_available_agents`` and ``get_skills_for_task``: what the agent can delegate to, and
which skills fit a task.

``get_skills_for_task`` ranks the skill library by embedding similarity between the task and
each skill's name and description (the skills' vectors are computed once, on the first call),
so it scales to a library too large for the system prompt's catalogue. Both read only
in-process data: Safe in the default policy. Neither is in a profile's tools by default: an
``agents.yaml`` agent lists them (``tools: [..., get_skills_for_task]``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from nanocrab.tools.base import ToolArgs, ToolContext, ToolResult

if TYPE_CHECKING:
    from nanocrab.memory import Embedder, Vectors
    from nanocrab.skills import SkillLibrary


class NoArgs(ToolArgs):
    pass


class AvailableAgentsTool:
    name: ClassVar[str] = "get_available_agents"
    group: ClassVar[str] = "agents"
    description: ClassVar[str] = (
        "List the agents a subagent can be spawned as: name, what it is for, its tools."
    )
    args_model: ClassVar[type[ToolArgs]] = NoArgs
    idempotent: ClassVar[bool] = True

    async def run(self, args: NoArgs, ctx: ToolContext) -> ToolResult:
        from nanocrab.agents import PROFILES

        lines = [f"- {p.name}: {p.description} (tools: {', '.join(p.tools)})"
                 for p in PROFILES.values()]  # fmt: skip
        return ToolResult.text("\n".join(lines))


class SkillsForTaskArgs(ToolArgs):
    task: str = Field(min_length=1, description="The task, in a sentence.")
    k: int = Field(default=3, ge=1, le=10, description="How many skills at most.")


class SkillsForTaskTool:
    name: ClassVar[str] = "get_skills_for_task"
    group: ClassVar[str] = "agents"
    description: ClassVar[str] = (
        "Find the skills whose instructions fit a task (by meaning), best first; load one with "
        "the `skill` tool."
    )
    args_model: ClassVar[type[ToolArgs]] = SkillsForTaskArgs
    idempotent: ClassVar[bool] = True

    def __init__(
        self, skills: SkillLibrary, embedder: Callable[[], Embedder] | None = None
    ) -> None:
        self._skills = skills
        self._factory = embedder
        self._names: list[str] = []
        self._matrix: Vectors | None = None

    def rank(self, task: str, k: int) -> list[tuple[str, float]]:
        import numpy as np

        factory = self._factory
        if factory is None:
            from nanocrab.memory import default_embedder

            factory = default_embedder
        embedder = factory()
        if self._matrix is None:
            self._names = self._skills.names()
            texts = [f"{n}: {self._skills.get(n).description}"  # type: ignore[union-attr]
                     for n in self._names]  # fmt: skip
            empty = np.zeros((0, embedder.dim), dtype=np.float32)
            self._matrix = np.vstack([embedder.embed([t])[0] for t in texts]) if texts else empty
        scores = self._matrix @ embedder.embed([task])[0]
        order = np.argsort(-scores, kind="stable")[:k]
        return [(self._names[i], round(float(scores[i]), 3)) for i in order]

    async def run(self, args: SkillsForTaskArgs, ctx: ToolContext) -> ToolResult:
        ranked = await asyncio.to_thread(self.rank, args.task, args.k)
        if not ranked:
            return ToolResult.text("No skills are installed.")
        lines = []
        for name, score in ranked:
            skill = self._skills.get(name)
            about = " ".join(skill.description.split()) if skill is not None else ""
            lines.append(f"- {name} ({score:.2f}): {about}")
        return ToolResult.text("\n".join(lines))
