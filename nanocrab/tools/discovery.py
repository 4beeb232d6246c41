"""``get_available_agents`` and ``get_skills_for_task``: what the agent can delegate to, and
which skills fit a task.

``get_skills_for_task`` first classifies the task into a task type of the skill map
(``nanocrab/skills/taskmap.py``: mean cosine similarity to each type's description and
examples, above the map's threshold and margin) and answers that type's skills; then it ranks
the rest of the library by embedding similarity between the task and each skill's name and
description, so it scales to a library too large for the system prompt's catalogue. The
vectors of the types and of the skills are computed on the first call and again only when the
library or the map object changes (hot reload swaps whole objects). Both tools read only
in-process data: Safe in the default policy. Neither is in a profile's tools by default: an
``agents.yaml`` agent lists them (``tools: [..., get_skills_for_task]``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from nanocrab.tools.base import ToolArgs, ToolContext, ToolResult

if TYPE_CHECKING:
    from nanocrab.memory import Embedder, Vectors
    from nanocrab.skills import SkillLibrary
    from nanocrab.skills.taskmap import SkillMap


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

        lines = [
            f"- {p.name}: {p.description} (tools: {', '.join(p.tools)})"
            + (f" (model: {p.model})" if p.model else "")
            for p in PROFILES.values()
        ]
        return ToolResult.text("\n".join(lines))


class SkillsForTaskArgs(ToolArgs):
    task: str = Field(min_length=1, description="The task, in a sentence.")
    k: int = Field(default=3, ge=1, le=10, description="How many skills at most.")


@dataclass(frozen=True, slots=True)
class SkillMatch:
    name: str
    score: float  # cosine similarity: of the task type (mapped) or of the skill's description
    task_type: str | None  # the task type that mapped it, None: found by similarity alone


class SkillsForTaskTool:
    name: ClassVar[str] = "get_skills_for_task"
    group: ClassVar[str] = "agents"
    description: ClassVar[str] = (
        "Find the skills whose instructions fit a task, best first: those mapped to the task's "
        "type, then others by meaning. Load one with the `skill` tool."
    )
    args_model: ClassVar[type[ToolArgs]] = SkillsForTaskArgs
    idempotent: ClassVar[bool] = True

    def __init__(
        self,
        skills: SkillLibrary,
        skillmap: SkillMap | None = None,
        embedder: Callable[[], Embedder] | None = None,
    ) -> None:
        self._skills = skills
        self.skillmap = skillmap  # swap the object to change the map (hot reload)
        self._factory = embedder
        self._skill_key: tuple[tuple[str, str], ...] | None = None
        self._skill_matrix: Vectors | None = None
        self._map_of: SkillMap | None = None
        self._type_matrix: Vectors | None = None
        self._type_owners: list[int] = []

    def _embedder(self) -> Embedder:
        factory = self._factory
        if factory is None:
            from nanocrab.memory import default_embedder

            factory = default_embedder
        return factory()

    def _embed_all(self, embedder: Embedder, texts: list[str]) -> Vectors:
        import numpy as np

        if not texts:
            return np.zeros((0, embedder.dim), dtype=np.float32)
        return np.vstack([embedder.embed([t])[0] for t in texts])

    def task_type(self, task: str) -> tuple[str, float] | None:
        """The skill map's type for ``task`` and its score, ``None`` when none clears the
        threshold and margin (or there is no map)."""
        import numpy as np

        smap = self.skillmap
        if smap is None or not smap.types:
            return None
        embedder = self._embedder()
        if self._map_of is not smap:
            owners, texts = [], []
            for i, t in enumerate(smap.types):
                for text in (t.description, *t.examples):
                    owners.append(i)
                    texts.append(text)
            self._type_matrix = self._embed_all(embedder, texts)
            self._type_owners = owners
            self._map_of = smap
        assert self._type_matrix is not None
        sims = self._type_matrix @ embedder.embed([task])[0]
        owners_arr = np.asarray(self._type_owners)
        mean = np.bincount(owners_arr, weights=sims) / np.bincount(owners_arr)
        order = np.argsort(-mean, kind="stable")
        best = float(mean[order[0]])
        lead = best - float(mean[order[1]]) if len(order) > 1 else best
        if best < smap.threshold or lead < smap.margin:
            return None
        return smap.types[int(order[0])].name, round(best, 3)

    def rank(self, task: str, k: int) -> list[SkillMatch]:
        """At most ``k`` skills for ``task``: the task type's (in the map's order), then the
        others by similarity. Skills the library does not have are left out."""
        import numpy as np

        out: list[SkillMatch] = []
        typed = self.task_type(task)
        if typed is not None and self.skillmap is not None:
            name, score = typed
            (ttype,) = [t for t in self.skillmap.types if t.name == name]
            out = [SkillMatch(s, score, name) for s in ttype.skills if s in self._skills][:k]
        names = self._skills.names()
        key = tuple((n, self._skills.get(n).description) for n in names)  # type: ignore[union-attr]
        embedder = self._embedder()
        if self._skill_key != key:
            self._skill_matrix = self._embed_all(embedder, [f"{n}: {d}" for n, d in key])
            self._skill_key = key
        assert self._skill_matrix is not None
        if len(out) >= k or not names:
            return out
        scores = self._skill_matrix @ embedder.embed([task])[0]
        taken = {m.name for m in out}
        for i in np.argsort(-scores, kind="stable"):
            if len(out) >= k:
                break
            if names[i] not in taken:
                out.append(SkillMatch(names[i], round(float(scores[i]), 3), None))
        return out

    async def run(self, args: SkillsForTaskArgs, ctx: ToolContext) -> ToolResult:
        ranked = await asyncio.to_thread(self.rank, args.task, args.k)
        if not ranked:
            return ToolResult.text("No skills are installed.")
        lines = []
        for m in ranked:
            skill = self._skills.get(m.name)
            about = " ".join(skill.description.split()) if skill is not None else ""
            why = f"task type {m.task_type}" if m.task_type else "similar"
            lines.append(f"- {m.name} ({why}, {m.score:.2f}): {about}")
        return ToolResult.text("\n".join(lines))
