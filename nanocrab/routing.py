"""Routing a task to an agent: the ``agents.yaml`` file and the decision.

``agents.yaml``::

    version: 1
    default: default            # the agent when nothing else decides
    threshold: 0.08             # embedding route: best score at least this ...
    margin: 0.01                # ... and at least this far ahead of the runner-up
    agents:
      - name: coder
        description: Writes and fixes code in the workspace.
        examples: ["fix the failing test in parser.py", "add a --json flag to the CLI"]
        tools: [read, write, edit, exec]     # optional: the profile's tools (None = default's)
        skills: []                            # preloaded skills
        model: null                           # optional: the model of its runs
        models: [claude-haiku-4-5]            # optional: failover models, in order (a name,
                                              # or {provider: NAME, model: NAME})
      - name: todo-counter                    # a Python agent (docs/agents.md): its code
        description: Counts TODO markers.     # plays the model's part of its runs
        module: agents/todo_counter.py        # relative to this file's directory
        class: TodoCounter                    # optional: default ``Agent``
        tools: [ls, grep, read]

The decision (:meth:`Router.decide`): the task is embedded; each agent's score is the mean
cosine similarity between the task and the agent's description and examples (its centroid's
score; on ``tests/data/routing`` it beat the nearest example, 88.9 % against 78.6 %, and the
mean of the top 2/3/5). The best agent wins
when its score clears ``threshold`` and leads the runner-up by ``margin`` (method
``embedding``); otherwise a model classifies the task among the agents' names and descriptions
(``llm``) when one is given and answers a known name; otherwise ``default`` (``fallback``).

Errors name the file and line (``AgentsError``), like the policy file's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nanocrab.agents import AgentProfile, ModelChoice
from nanocrab.yamlfile import parse_model

if TYPE_CHECKING:
    from nanocrab.memory import Embedder, Vectors

Method = Literal["embedding", "llm", "fallback"]


class AgentsError(Exception):
    """``agents.yaml`` is unreadable or invalid; the message names the file and line."""


class AgentSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$")
    description: str = Field(min_length=1)
    examples: tuple[str, ...] = ()
    tools: tuple[str, ...] | None = None
    skills: tuple[str, ...] = ()
    model: str | None = None
    models: tuple[str | ModelChoice, ...] = ()  # failover, after ``model`` (llm/failover.py)
    planner: bool = False  # plans first, then runs step by step (events/plans.py)
    # the agent's own system prompt (else: a built-in profile's, or the default's with the
    # description as its role) and limits (else: the profile's)
    prompt: str | None = Field(default=None, min_length=1)
    max_steps: int | None = Field(default=None, ge=1, le=500)
    timeout_s: float | None = Field(default=None, gt=0)
    # a Python agent: the module (a .py path relative to the directory of the agents.yaml
    # declaring it) and its class; its runs are answered by its code (nanocrab/pyagent)
    module: str | None = Field(default=None, pattern=r"\.py$")
    agent_class: str | None = Field(
        default=None, alias="class", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$"
    )

    @model_validator(mode="after")
    def _python(self) -> AgentSpec:
        if self.agent_class is not None and self.module is None:
            raise ValueError(f"agent {self.name!r}: 'class' needs a 'module'")
        return self


class AgentsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    default: str = "default"
    threshold: float = Field(default=0.08, ge=-1.0, le=1.0)
    margin: float = Field(default=0.01, ge=0.0, le=2.0)
    agents: tuple[AgentSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self) -> AgentsConfig:
        names = [a.name for a in self.agents]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"agent names must be unique: {sorted(dup)}")
        if self.default not in names:
            raise ValueError(f"default {self.default!r} is not one of the agents {names}")
        return self

    @property
    def routed(self) -> bool:
        """Whether routing is on: more than one agent to choose from."""
        return len(self.agents) > 1

    def agent(self, name: str) -> AgentSpec | None:
        return next((a for a in self.agents if a.name == name), None)


def load_agents(path: Path) -> AgentsConfig:
    """The agents in ``path``; :class:`AgentsError` with ``file:line`` when it is wrong."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AgentsError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    return parse_agents(text, source)


def parse_agents(text: str, source: str = "<agents.yaml>") -> AgentsConfig:
    return parse_model(
        text, source, AgentsConfig, AgentsError, what="agents files",
        shape="agents.yaml is a mapping with 'version: 1' and 'agents'",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Decision:
    agent: str
    score: float
    margin: float
    method: Method
    scores: dict[str, float] = field(default_factory=dict)  # every agent's, best first


Classifier = Callable[[str, Sequence[AgentSpec]], Awaitable[str | None]]


class Router:
    """Decides an agent for a task (see the module docstring). The agents' texts are embedded
    once, at construction; a decision embeds the task alone (one text: ~2-5 ms on a CPU)."""

    def __init__(self, config: AgentsConfig, embedder: Embedder) -> None:
        import numpy as np

        self.config = config
        self._embedder = embedder
        owners: list[int] = []
        texts: list[str] = []
        for i, agent in enumerate(config.agents):
            for t in (agent.description, *agent.examples):
                owners.append(i)
                texts.append(t)
        self._owners = np.asarray(owners)
        self._counts = np.bincount(self._owners).astype(np.float64)
        self._matrix: Vectors = np.vstack([embedder.embed([t])[0] for t in texts])

    def embed(self, text: str) -> list[float]:
        """``text``'s vector (the embedder's cache makes a second call for the same text free)."""
        return [float(x) for x in self._embedder.embed([text])[0]]

    def scores(self, text: str) -> dict[str, float]:
        """Every agent's score for ``text``, best first."""
        import numpy as np

        q = self._embedder.embed([text])[0]
        sims = self._matrix @ q
        mean = np.bincount(self._owners, weights=sims) / self._counts
        order = np.argsort(-mean, kind="stable")
        return {self.config.agents[i].name: round(float(mean[i]), 4) for i in order}

    def by_embedding(self, text: str) -> Decision:
        """The embedding route alone: ``method`` is ``embedding`` when it clears the threshold
        and margin, else ``fallback`` with the default agent."""
        scores = self.scores(text)
        ranked = list(scores.items())
        top, score = ranked[0]
        margin = score - ranked[1][1] if len(ranked) > 1 else score
        if score >= self.config.threshold and margin >= self.config.margin:
            return Decision(top, score, round(margin, 4), "embedding", scores)
        return Decision(self.config.default, score, round(margin, 4), "fallback", scores)

    async def decide(self, text: str, classify: Classifier | None = None) -> Decision:
        decision = self.by_embedding(text)
        if decision.method == "embedding" or classify is None:
            return decision
        try:
            named = await classify(text, self.config.agents)
        except Exception:  # a model failure must not block the task: the default runs it
            named = None
        if named is not None and self.config.agent(named) is not None:
            return Decision(named, decision.score, decision.margin, "llm", decision.scores)
        return decision


def classifier_prompt(text: str, agents: Sequence[AgentSpec]) -> str:
    """What a model is asked when the embedding route is unsure."""
    lines = "\n".join(f"- {a.name}: {a.description}" for a in agents)
    return (
        "Pick the agent best suited to the task. Answer with the agent's name only.\n"
        f"Agents:\n{lines}\n\nTask: {text}"
    )


def parse_choice(answer: str, agents: Sequence[AgentSpec]) -> str | None:
    """The first known agent name in a model's answer."""
    words = answer.strip().lower().replace("`", " ").replace(".", " ").split()
    names = {a.name for a in agents}
    return next((w for w in words if w in names), None)


def agents_file(home: Path, environ: Mapping[str, str]) -> Path | None:
    """``NANOCRAB_AGENTS`` if set (``none``: no routing), else ``<home>/agents.yaml`` if it
    exists, else ``None``."""
    named = environ.get("NANOCRAB_AGENTS")
    if named:
        return None if named == "none" else Path(named)
    path = home / "agents.yaml"
    return path if path.is_file() else None


def agent_profiles(
    config: AgentsConfig, base: Mapping[str, AgentProfile], *, only_new: bool = False
) -> dict[str, AgentProfile]:
    """``base`` with the declared agents' profiles (pure): an agent named like a profile of
    ``base`` keeps its prompt and limits, with the declared prompt, limits, tools, skills,
    models and planner flag when given; another one gets the default prompt with its
    description (or its declared prompt). ``only_new``:
    add the agents ``base`` does not name yet, change none."""
    from nanocrab.agents import DEFAULT

    profiles = dict(base)
    for spec in config.agents:
        if only_new and spec.name in base:
            continue
        prof = base.get(spec.name)
        if prof is None:
            prof = AgentProfile(
                name=spec.name, description=spec.description,
                system_prompt=f"{DEFAULT.system_prompt}\n\nYour role: {spec.description}",
                tools=DEFAULT.tools,
            )  # fmt: skip
        updates: dict[str, object] = {}
        if spec.tools is not None:
            updates["tools"] = tuple(spec.tools)
        if spec.skills:
            updates["skills"] = tuple(spec.skills)
        if spec.model:
            updates["model"] = spec.model
        if spec.models:
            updates["models"] = tuple(
                m if isinstance(m, ModelChoice) else ModelChoice(model=m) for m in spec.models
            )
        if spec.prompt is not None:
            updates["system_prompt"] = spec.prompt
        if spec.max_steps is not None:
            updates["max_steps"] = spec.max_steps
        if spec.timeout_s is not None:
            updates["timeout_s"] = spec.timeout_s
        if spec.planner:  # its first model call offers the plan tool (orchestrator/plan.py)
            tools: tuple[str, ...] = spec.tools if spec.tools is not None else prof.tools
            updates["planner"] = True
            updates["tools"] = tools if "plan" in tools else (*tools, "plan")
        profiles[spec.name] = prof.model_copy(update=updates)
    return profiles


def install_profiles(config: AgentsConfig, *, only_new: bool = False) -> None:
    """Make the declared agents known to :func:`nanocrab.agents.profile` for runs pinned to no
    configuration version (this process's start-up profiles, :func:`agent_profiles` on them).
    ``only_new``: add the agents no profile names yet, change none. A configuration version
    has its own table (:func:`nanocrab.agents.profiles_for`)."""
    from nanocrab.agents import PROFILES

    PROFILES.update(agent_profiles(config, PROFILES, only_new=only_new))
