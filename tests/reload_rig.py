"""The agent loop wired with a versioned configuration and a reloader, for the reload tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog, Reactor, read
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.events import Event, TextBlock, ToolUseBlock, Usage
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator, SpawnTool
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.handlers.reloader import Reloader
from nanocrab.llm.base import DeltaSink, LlmError, ModelRequest, ModelResponse
from nanocrab.reload import BaseConfig, ConfigView, HealthOptions, LoadedConfig
from nanocrab.reload.skills import VersionedSkills
from nanocrab.security import KeyRing, signed_by
from nanocrab.skills import SkillLibrary, SkillTool, bundled_skills_dir
from nanocrab.tools import LocalOperations, ToolRegistry, default_tools

from .agent_fixtures import OPEN_POLICY

OPEN_POLICY_YAML = """\
version: 1
rules:
  - id: workspace
    tools: [read, write, edit, ls, glob, grep]
    paths: ["${workspace}"]
    tier: safe
  - id: agent
    tools: [skill, spawn]
    tier: safe
"""

NO_READ_POLICY_YAML = """\
version: 1
rules:
  - id: agent
    tools: [skill, spawn]
    tier: safe
"""


def skill_md(name: str, description: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}\n"


def write_config(config_dir: Path, *, policy: str = OPEN_POLICY_YAML, **skills: str) -> None:
    """``skills``: name → SKILL.md text."""
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "policy.yaml").write_text(policy)
    for name, text in skills.items():
        (config_dir / "skills" / name).mkdir(parents=True, exist_ok=True)
        (config_dir / "skills" / name / "SKILL.md").write_text(text)


class Model:
    """A model driven by the task text: ``call <tool> <arg>=<value>`` asks for that tool on its
    first turn, then answers ``done``; ``hold`` waits for :attr:`release` before the first
    answer; a system prompt naming ``poison`` fails (fatal). Keeps every system prompt."""

    name = "test"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.holding = asyncio.Event()
        self.systems: dict[str, list[str]] = {}

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        self.systems.setdefault(request.run_id, []).append(request.system)
        if "poison" in request.system:
            raise LlmError("fatal", "the configuration poisons this model")
        words = request.task.split()
        if request.turn == 0 and "hold" in words:
            self.holding.set()
            await self.release.wait()
        if request.turn == 0 and words and words[0] == "call":
            key, _, value = words[2].partition("=")
            block = ToolUseBlock(id=f"t{request.run_id[-6:]}", name=words[1], input={key: value})
            return ModelResponse(content=[block], stop_reason="tool_use", usage=Usage())
        return ModelResponse(content=[TextBlock(text="done")], stop_reason="end_turn")


def make_view(log: EventLog, cache: Path) -> ConfigView:
    bundled = bundled_skills_dir()
    startup = LoadedConfig(
        version="", policy=OPEN_POLICY, guardrails=None, guardrails_text=None, agents=None,
        skills=SkillLibrary.discover([bundled]),
    )  # fmt: skip
    base = BaseConfig(guardrails=False, skill_dirs=(bundled,))
    return ConfigView(startup, base=base, cache_dir=cache, log=log)


def reload_reactors(
    log: EventLog,
    engine: AsyncEngine,
    model: Model,
    workspace: Path,
    *,
    view: ConfigView,
    config_dir: Path,
    keys: KeyRing,
    health: HealthOptions | None = None,
    orchestrators: int = 1,
    views: Callable[[], ConfigView] | None = None,
) -> tuple[list[Reactor], Reloader]:
    """The loop on ``view``; extra orchestrator instances (same durable) get their own view
    from ``views`` (as separate processes would)."""
    skills = VersionedSkills(view)
    reg = ToolRegistry([*default_tools(), SkillTool(skills), SpawnTool()])
    policy_keys = frozenset({keys.public_key("policy")})
    reloader = Reloader(
        log, view=view, config_dir=config_dir, health=health, debounce_ms=300, step_ms=20
    )
    reactors: list[Reactor] = [
        Orchestrator(
            log, trust=signed_by(policy_keys),
            config=view if i == 0 or views is None else views(),
        )
        for i in range(orchestrators)
    ]  # fmt: skip
    reactors += [
        PolicyHandler(log, policy=OPEN_POLICY, keys=keys, known_tools=frozenset(reg.names()),
                      default_workspace=workspace, config=view),
        Executor(log, registry=reg, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
                 default_workspace=workspace, tool_timeout_s=20, trusted_policy=policy_keys,
                 trusted_approvers=trusted_approvers(OPEN_POLICY, keys), config=view),
        LlmHandler(log, provider=model, registry=reg, default_workspace=workspace,
                   skills=skills, backoff_s=0.01, backoff_max_s=0.05),
        reloader,
    ]  # fmt: skip
    return reactors, reloader


async def next_reload(
    log: EventLog, predicate: Callable[[Event], bool], timeout: float = 20.0
) -> Event:
    """The first ``reload.*`` event of the log satisfying ``predicate`` (waits for it)."""

    async def find() -> Event:
        async for stored in read(log, log.subjects.of_type("reload.*"), follow=True):
            if stored.event is not None and predicate(stored.event):
                return stored.event
        raise AssertionError("the log ended")

    return await asyncio.wait_for(find(), timeout)
