"""Builds the agent runtime's handlers from settings: provider, tools, skills, workspace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog, Reactor
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.cli.settings import Settings
from nanocrab.handlers.conversation import history_messages
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator, SpawnTool
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.llm import AnthropicProvider, ScriptedProvider
from nanocrab.llm.base import Message, Provider
from nanocrab.policy import Policy, load_policy
from nanocrab.projections import session_history
from nanocrab.security import KeyRing, verify
from nanocrab.skills import SkillLibrary, SkillTool, default_skill_dirs
from nanocrab.tools import LocalOperations, ToolRegistry, default_tools


def make_provider(settings: Settings) -> Provider:
    if settings.provider == "anthropic":
        assert settings.anthropic_api_key is not None
        options = {"model": settings.model} if settings.model else {}
        return AnthropicProvider(api_key=settings.anthropic_api_key.get_secret_value(), **options)
    return ScriptedProvider.from_yaml(settings.script)


def build_reactors(
    log: EventLog,
    engine: AsyncEngine,
    settings: Settings,
    *,
    default_workspace: Path | None = None,
    provider: Provider | None = None,
    policy: Policy | None = None,
    log_for: Callable[[str], EventLog] | None = None,
) -> list[Reactor]:
    """The agent loop: orchestrator, policy, executor, LLM handler. ``policy`` defaults to the
    settings' policy file (or the bundled default). ``log_for(name)`` is each reactor's log (its
    own NATS identity under broker permissions); without it every reactor appends with ``log``."""
    logs = log_for or (lambda _name: log)
    workspace = default_workspace or (settings.home / "workspace")
    workspace.mkdir(parents=True, exist_ok=True)
    skills = SkillLibrary.discover(
        default_skill_dirs(workspace=None, user_dir=settings.user_skills)
    )
    registry = ToolRegistry(
        [*default_tools(web_allow=settings.web_allow), SkillTool(skills), SpawnTool()]
    )

    async def history(session_id: str, run_id: str, before_seq: int) -> list[Message]:
        rows = await session_history(engine, session_id, run_id, before_seq=before_seq)
        return history_messages(rows)

    rules = policy or load_policy(settings.policy_file)
    keys = KeyRing(settings.keys_dir)
    policy_keys = frozenset({keys.public_key("policy")})
    approvers = trusted_approvers(rules, keys)

    def trust(event: object) -> bool:
        return verify(event, policy_keys) is None  # type: ignore[arg-type]

    return [
        Orchestrator(logs("orchestrator"), trust=trust),
        PolicyHandler(
            logs("policy"),
            policy=rules,
            keys=keys,
            known_tools=frozenset(registry.names()),
            default_workspace=workspace,
        ),
        Executor(
            logs("executor"),
            registry=registry,
            ops=LocalOperations(),
            artifacts=JetStreamArtifacts(logs("executor")),
            default_workspace=workspace,
            trusted_policy=policy_keys,
            trusted_approvers=approvers,
        ),
        LlmHandler(
            logs("llm"),
            provider=provider or make_provider(settings),
            registry=registry,
            default_workspace=workspace,
            model=settings.model,
            skills=skills,
            history=history,
        ),
    ]
