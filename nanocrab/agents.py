"""Agent profiles: which tools and skills a kind of agent gets, its prompt and its limits."""

from __future__ import annotations

from collections.abc import Sequence

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


def profile(name: str) -> AgentProfile:
    """The named profile; unknown names fall back to ``default`` (the router may name others)."""
    return PROFILES.get(name) or PROFILES.get("default", DEFAULT)


def add_default_tools(names: Sequence[str]) -> None:
    """Give the ``default`` profile (this process) more tools, after its own: the tools of the
    MCP servers of ``mcp.yaml``. Other profiles get them by naming them (agents.yaml)."""
    base = PROFILES.get("default", DEFAULT)
    extra = tuple(n for n in names if n not in base.tools)
    PROFILES["default"] = base.model_copy(update={"tools": (*base.tools, *extra)})


def enabled_tools(agent: str, requested: list[str] | None) -> list[str]:
    """The profile's tools, narrowed (never widened) by the task's own list, in profile order."""
    tools = profile(agent).tools
    if requested is None:
        return list(tools)
    allowed = set(requested)
    return [t for t in tools if t in allowed]
