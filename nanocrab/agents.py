"""Agent profiles: which tools and skills a kind of agent gets, its prompt and its limits."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

ALL_HOST_TOOLS = ("read", "write", "edit", "ls", "glob", "grep", "exec", "web_fetch", "python")


class ModelChoice(BaseModel):
    """A failover target: ``model`` on ``provider`` (``None``: the LLM handler's own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1)
    provider: str | None = None


class AgentProfile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    system_prompt: str
    tools: tuple[str, ...]
    skills: tuple[str, ...] = ()  # preloaded: their bodies go into the system prompt
    max_steps: int = Field(default=25, ge=1, le=500)
    timeout_s: float = Field(default=900.0, gt=0)
    planner: bool = False
    """Plan first (the ``plan`` tool), then work step by step with each step's declared tools
    (handlers/orchestrator/plan.py)."""
    model: str | None = None  # the model of this agent's runs (agents.yaml); None: the default
    # failover: the models tried after ``model``, in order (nanocrab/llm/failover.py)
    models: tuple[ModelChoice, ...] = ()


DEFAULT = AgentProfile(
    name="default",
    description="A general engineering agent working in one workspace directory.",
    system_prompt=(
        "You are nanocrab, a careful engineering agent. You work inside one workspace directory "
        "and can only touch files there. Use the tools to look before you change anything, make "
        "the smallest change that solves the task, check your work by running it, and finish "
        "with a short answer that says what you did and what you found. When a skill in the "
        "catalogue fits the task, load it with the `skill` tool first."
    ),
    tools=(*ALL_HOST_TOOLS, "skill", "spawn", "capability", "remember", "recall"),
)

EXPLORER = AgentProfile(
    name="explorer",
    description="A read-only subagent that investigates and reports back.",
    system_prompt=(
        "You are a read-only research subagent. Investigate the question with the tools you "
        "have, then answer concisely with what you found and where (paths, line numbers)."
    ),
    tools=("read", "ls", "glob", "grep", "skill"),
    max_steps=12,
    timeout_s=300.0,
)

PROFILES: dict[str, AgentProfile] = {p.name: p for p in (DEFAULT, EXPLORER)}
"""The start-up profiles of this process (its ``agents.yaml``, installed once by
:func:`nanocrab.routing.install_profiles`): runs pinned to no configuration version use them."""

BUILTIN: dict[str, AgentProfile] = dict(PROFILES)
"""The built-in profiles: what a configuration version's ``agents.yaml`` is applied to."""

ProfileBuilder = Callable[[Mapping[str, AgentProfile]], Mapping[str, AgentProfile]]
"""Builds a version's profile table from the built-in ones (``nanocrab.routing.agent_profiles``
with the version's agents)."""

_extra_tools: list[str] = []  # add_default_tools: the default profile's tools after its own
_builders: dict[str, ProfileBuilder] = {}
_tables: dict[str, Mapping[str, AgentProfile]] = {}


def register_profiles(version: str, build: ProfileBuilder) -> None:
    """Make configuration version ``version``'s profiles known (the config view does, when it
    loads a version whose ``agents.yaml`` it holds); built on first use. Versions are content
    hashes: registering one again changes nothing."""
    if version and version not in _builders:
        _builders[version] = build


def base_profiles() -> dict[str, AgentProfile]:
    """The built-in profiles, the default one with this process's extra tools
    (:func:`add_default_tools`): what a version's agents are built on."""
    base = dict(BUILTIN)
    default = base.get("default", DEFAULT)
    extra = tuple(n for n in _extra_tools if n not in default.tools)
    if extra:
        base["default"] = default.model_copy(update={"tools": (*default.tools, *extra)})
    return base


def profiles_for(version: str | None) -> Mapping[str, AgentProfile]:
    """The profile table of configuration version ``version`` (a run's ``run.started.config``):
    its ``agents.yaml`` on top of the built-in profiles. ``None``, ``""`` (the start-up
    configuration) or a version this process has not registered: the start-up profiles."""
    if not version:
        return PROFILES
    table = _tables.get(version)
    if table is None:
        build = _builders.get(version)
        if build is None:
            return PROFILES
        table = _tables[version] = build(base_profiles())
    return table


def profile(name: str, version: str | None = None) -> AgentProfile:
    """The named profile as configuration version ``version`` has it (:func:`profiles_for`: a
    built-in profile the version does not declare is the built-in one); a name neither built in
    nor declared by the version keeps this process's start-up profile, and unknown names fall
    back to ``default`` (the router may name others)."""
    table = profiles_for(version)
    found = table.get(name) or PROFILES.get(name)
    return found or table.get("default") or PROFILES.get("default", DEFAULT)


def add_default_tools(names: Sequence[str]) -> None:
    """Give the ``default`` profile (this process, and every configuration version's) more
    tools, after its own: the tools of the MCP servers of ``mcp.yaml``. Other profiles get them
    by naming them (agents.yaml)."""
    base = PROFILES.get("default", DEFAULT)
    extra = tuple(n for n in names if n not in base.tools)
    PROFILES["default"] = base.model_copy(update={"tools": (*base.tools, *extra)})
    _extra_tools.extend(n for n in names if n not in _extra_tools)
    _tables.clear()  # built again with them


def enabled_tools(agent: str, requested: list[str] | None, version: str | None = None) -> list[str]:
    """The profile's tools (as configuration version ``version`` has them), narrowed (never
    widened) by the task's own list, in profile order."""
    tools = profile(agent, version).tools
    if requested is None:
        return list(tools)
    allowed = set(requested)
    return [t for t in tools if t in allowed]
