"""Builds the agent runtime's handlers from settings: provider, tools, skills, workspace."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.agents import add_default_tools
from nanocrab.backends import backends_setup
from nanocrab.bus import EventLog, Reactor
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.capabilities.config import (
    CapabilityConfig,
    capabilities_file,
    load_capability_config,
)
from nanocrab.capabilities.deps import blocked as capability_blocked
from nanocrab.capabilities.pin import Pinned
from nanocrab.cli.settings import Settings
from nanocrab.connectors import connectors_setup
from nanocrab.guardrails import load_guardrails
from nanocrab.handlers.alerts import AlertSink
from nanocrab.handlers.capgen import CapgenHandler
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.guardrails import Chain, GuardrailsHandler, Prescreener
from nanocrab.handlers.hooks import HooksHandler
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator, SpawnTool
from nanocrab.handlers.orchestrator.budget import Spending, Spent
from nanocrab.handlers.orchestrator.plan import PlanTool
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.handlers.pyagent import PyAgentHandler
from nanocrab.handlers.reloader import Reloader
from nanocrab.handlers.router import RouterHandler, model_classifier
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.sessions import SessionIndex
from nanocrab.hooks import Hooks, hooks_file
from nanocrab.llm import CAPGEN_SCRIPT, DEFAULT_MODEL, ScriptedProvider
from nanocrab.llm.base import Provider
from nanocrab.mcp import mcp_setup
from nanocrab.policy import Policy, load_policy
from nanocrab.projections import capability, list_capabilities
from nanocrab.projections.capabilities import dependency_nodes
from nanocrab.projections.memory_search import Recaller, RunTenant, recaller
from nanocrab.projections.memory_search import searcher as memory_searcher
from nanocrab.projections.sessions import session_snapshot
from nanocrab.reload import BaseConfig, ConfigView, LoadedConfig
from nanocrab.reload.skills import VersionedSkills
from nanocrab.routing import AgentsConfig, agents_file, install_profiles, load_agents
from nanocrab.sandbox import Sandbox
from nanocrab.security import KeyRing, signed_by
from nanocrab.skills import SkillLibrary, SkillTool, default_skill_dirs
from nanocrab.skills.taskmap import load_skillmap, skillmap_file
from nanocrab.tools import LocalOperations, ToolRegistry, default_tools
from nanocrab.tools.capability import CapabilityTool, EnabledCapability
from nanocrab.tools.discovery import AvailableAgentsTool, SkillsForTaskTool
from nanocrab.tools.memory import RecallTool, RememberTool
from nanocrab.tools.search import SearchProvider, make_search_provider


def make_provider(settings: Settings) -> Provider:
    if settings.provider == "anthropic":
        from nanocrab.llm.anthropic import AnthropicProvider  # a second of imports: only here

        assert settings.anthropic_api_key is not None
        return AnthropicProvider(
            api_key=settings.anthropic_api_key.get_secret_value(),
            model=settings.model or DEFAULT_MODEL,
        )
    return ScriptedProvider.from_yaml(settings.script)


def make_capgen_provider(settings: Settings) -> Provider:
    """The model that writes capabilities: Claude with an API key; offline, the user's
    ``NANOCRAB_SCRIPT`` if set, else the bundled capability script (the demo script answers
    agent tasks, not code requests)."""
    if settings.provider == "scripted" and settings.script.resolve() == demo.SCRIPT.resolve():
        return ScriptedProvider.from_yaml(CAPGEN_SCRIPT)
    return make_provider(settings)


def sandbox_for(settings: Settings) -> Sandbox:
    """The WASM sandbox, its compiled interpreter cached under ``<home>/sandbox``."""
    return Sandbox(cache_dir=settings.home / "sandbox")


class CapabilityCatalogue:
    """The enabled capabilities as the ``capability`` tool and the policy see them: read from
    the registry projection (so ``enable``/``disable`` apply to the next call), each with why
    it is ``blocked`` (its dependency chain, the permissions ``capability_config`` permits)."""

    def __init__(self, engine: AsyncEngine, config: CapabilityConfig | None = None) -> None:
        self.engine = engine
        self.config = config or CapabilityConfig()

    async def lookup(self, name: str) -> EnabledCapability | None:
        detail = await capability(self.engine, name)
        if detail is None or not detail.row.enabled or detail.row.removed:
            return None
        row = detail.row
        code = next((v.code for v in detail.versions if v.version == row.version), None)
        if code is None:
            return None
        nodes = dependency_nodes(await list_capabilities(self.engine, include_removed=True))
        return EnabledCapability(
            name=row.name, version=row.version, description=row.description, entry=row.entry,
            parameters=row.parameters, permissions=tuple(row.permissions), source=code,
            user_guidance=row.user_guidance, requires=tuple(row.requires),
            blocked=capability_blocked(nodes, row.name, row.permissions, self.config),
        )  # fmt: skip

    async def enabled(self) -> list[EnabledCapability]:
        rows = await list_capabilities(self.engine)
        found = [await self.lookup(r.name) for r in rows if r.enabled and not r.removed]
        return [c for c in found if c is not None]

    async def permissions(self, name: str) -> Pinned | None:
        """What the policy decides a call on: the capability's permissions and its pin."""
        cap = await self.lookup(name)
        return None if cap is None else Pinned(cap.permissions, cap.pin)


def capability_config(settings: Settings) -> CapabilityConfig:
    """``capabilities.yaml``'s ``capability_config`` (``NANOCRAB_CAPABILITIES``, else in the
    config directory; defaults without); a bad file raises ``CapabilityConfigError``."""
    return load_capability_config(capabilities_file(config_dir(settings), os.environ))


def build_capgen(
    log: EventLog,
    settings: Settings,
    *,
    provider: Provider | None = None,
    sandbox: Sandbox | None = None,
    config: CapabilityConfig | None = None,
) -> CapgenHandler:
    """The capability generator (``log`` is its own: identity ``capgen``), with the settings
    of ``capabilities.yaml`` (``config``, default: read now)."""
    return CapgenHandler(
        log,
        provider=provider or make_capgen_provider(settings),
        sandbox=sandbox or sandbox_for(settings),
        model=settings.model,
        config=config or capability_config(settings),
    )


class ProjectedUsage:
    """The orchestrator's usage view (shared budget caps) over the usage projection."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def spending(
        self, *, run_id: str, session_id: str | None, agent: str, tenant: str
    ) -> Spending:
        from nanocrab.projections.usage import other_runs

        o = await other_runs(
            self.engine, run_id=run_id, session_id=session_id, agent=agent, tenant=tenant
        )
        return Spending(
            session=Spent(o.session.usd, o.session.tokens),
            agent=Spent(o.agent.usd, o.agent.tokens),
            tenant=Spent(o.tenant.usd, o.tenant.tokens),
        )


def build_reactors(
    log: EventLog,
    engine: AsyncEngine,
    settings: Settings,
    *,
    default_workspace: Path | None = None,
    provider: Provider | None = None,
    policy: Policy | None = None,
    log_for: Callable[[str], EventLog] | None = None,
    capgen_provider: Provider | None = None,
    guardrails: Chain | None = None,
    memory_every_s: float | None = None,
    keys: KeyRing | None = None,
) -> list[Reactor]:
    """The agent loop — orchestrator, policy, executor, LLM handler — and the capability
    generator. ``policy`` defaults to the settings' policy file (or the bundled default).
    ``provider`` is the agent's model; ``capgen_provider`` the generator's (default:
    :func:`make_capgen_provider`). ``log_for(name)`` is each reactor's log (its own NATS
    identity under broker permissions); without it every reactor appends with ``log``.
    ``guardrails`` defaults to the settings' chain (:func:`guardrails_chain`); a chain with no
    filter (or guardrails off) adds no handler and no hop. ``memory_every_s``: embed new
    memories in the background that often (``nanocrab up``; a one-shot run leaves them to the
    next search, so it never loads the embedding model for them)."""
    logs = log_for or (lambda _name: log)
    workspace = default_workspace or (settings.home / "workspace")
    workspace.mkdir(parents=True, exist_ok=True)
    skill_dirs = default_skill_dirs(workspace=None, user_dir=settings.user_skills)
    discovered = SkillLibrary.discover(skill_dirs)
    rules = policy or load_policy(settings.policy_file)
    chain = guardrails_chain(settings) if guardrails is None else guardrails
    # every handler reads configuration through one versioned view (hot reload, docs/reload.md)
    view = config_view(settings, logs("reloader"), discovered, rules, chain, skill_dirs)
    skills = VersionedSkills(view)
    sandbox = sandbox_for(settings)  # one per process: the python tool, capabilities, capgen
    capconfig = capability_config(settings)  # capabilities.yaml: a bad one stops start-up
    capabilities = CapabilityCatalogue(engine, capconfig)
    # mcp.yaml: the MCP servers' tools, listed and screened now; the executor owns the sessions
    mcp = mcp_setup(config_dir(settings), os.environ, log_dir=settings.home / "mcp-logs")
    add_default_tools([t.name for t in mcp.tools])
    # connectors.yaml: mail and calendar tools; their credentials stay with the executor
    connectors = connectors_setup(config_dir(settings), os.environ)
    # backends.yaml: agents whose tools run on a remote host (SSH); the executor keeps the keys
    backends = backends_setup(config_dir(settings), os.environ)
    add_default_tools([t.name for t in connectors.tools])
    search = search_provider(settings)  # web_search when a search API key is set
    # hooks.yaml: extension hooks (nanocrab/hooks), imported now so a bad one stops start-up
    hooks_path = hooks_file(settings.home, os.environ)
    hooks = Hooks.from_file(hooks_path) if hooks_path is not None else Hooks()
    if search is not None:
        add_default_tools(["web_search"])
    registry = ToolRegistry(
        [
            *default_tools(web_allow=settings.web_allow, sandbox=sandbox, search=search),
            *mcp.tools,
            *connectors.tools,
            SkillTool(skills),
            SpawnTool(),
            PlanTool(),
            CapabilityTool(
                sandbox,
                lookup=capabilities.lookup,
                catalogue=capabilities.enabled,
                limits=capconfig.limits.invocations(),
            ),
            RememberTool(),
            RecallTool(memory_searcher(engine, run_tenants(logs("executor")))),
            AvailableAgentsTool(),
            # the task-type -> skills map: NANOCRAB_SKILLMAP, <home>/skillmap.yaml, or bundled
            SkillsForTaskTool(skills, load_skillmap(skillmap_file(settings.home, os.environ))),
        ]
    )
    # agents.yaml with more than one agent: a router picks the agent of tasks naming none;
    # without, the router only consolidates /new's sessions (and the LLM handler recalls)
    routing = routing_config(settings)
    provider = provider or make_provider(settings)
    classify = model_classifier(provider, settings.model or "") if routing is not None else None
    router = RouterHandler(logs("router"), engine, config=routing, classify=classify,
                           vectorise_every_s=memory_every_s, versions=view)  # fmt: skip

    # the session's earlier messages, folded from the log (never stale, no wait on SQL);
    # the sessions projection loads a session this process has not seen yet
    history = SessionIndex(logs("llm"), snapshot=partial(session_snapshot, engine))

    guards: list[Reactor] = []
    # runs move on without waiting for a verdict the chain can only give as a clean allow
    prescreen = Prescreener(chain, config=view) if chain is not None and chain.guarded() else None
    if chain is not None and chain.guarded():
        sink = AlertSink(settings.alert_webhook) if settings.alert_webhook else None
        judge = None
        if settings.anthropic_api_key is not None:  # Claude's alignment check backs the rules
            from nanocrab.guardrails.alignment_llm import ClaudeAlignmentJudge

            judge = ClaudeAlignmentJudge(api_key=settings.anthropic_api_key.get_secret_value())
        guards.append(
            GuardrailsHandler(
                logs("guardrails"), chain=chain, alerts=sink, config=view, judge=judge,
                prescreen=prescreen,
            )
        )
    # a handler host's keys (`nanocrab handler`) hold only its own seed (cli/provision.py)
    keys = keys or KeyRing(settings.keys_dir)
    policy_keys = frozenset({keys.public_key("policy")})
    approvers = trusted_approvers(rules, keys)

    loop: list[Reactor] = [
        Orchestrator(
            logs("orchestrator"),
            trust=signed_by(policy_keys),
            guarded=chain.guarded() if guards and chain is not None else frozenset(),
            routed=routing is not None,
            config=view,
            prescreen=prescreen,
            budgets=rules.budgets,
            usage=ProjectedUsage(engine),
        ),
        PolicyHandler(
            logs("policy"),
            policy=rules,
            keys=keys,
            known_tools=frozenset(registry.names()),
            default_workspace=workspace,
            capability_permissions=capabilities.permissions,
            protected=[
                p
                for p in (
                    settings.home,
                    settings.policy_file,
                    *connectors.protected,
                    *backends.protected,
                )
                if p is not None
            ],
            config=view,
            tool_hosts={"web_search": search.endpoint.host} if search is not None else None,
            resources_of=connectors.resources,
        ),
        Executor(
            logs("executor"),
            registry=registry,
            ops=LocalOperations(),
            artifacts=JetStreamArtifacts(logs("executor")),
            default_workspace=workspace,
            trusted_policy=policy_keys,
            trusted_approvers=approvers,
            confinement=rules.exec.confinement(
                protected=(
                    settings.home,
                    settings.keys_dir,
                    *connectors.protected,
                    *backends.protected,
                )
            ),
            config=view,
            mcp=mcp.hub,
            notices=mcp.alerts,
            alert_sink=(
                AlertSink(settings.alert_webhook) if settings.alert_webhook and mcp.alerts else None
            ),
            hooks=hooks or None,
            backends=backends.by_agent,
        ),
        LlmHandler(
            logs("llm"),
            provider=provider,
            registry=registry,
            default_workspace=workspace,
            model=settings.model,
            skills=skills,
            history=history,
            recall=run_start_recall(engine, os.environ),
            routed=routing is not None,
            prescreen=prescreen,
            agents=view,  # runs of Python agents are answered by their code, not the model
            hooks=hooks or None,
        ),
        PyAgentHandler(logs("pyagent"), view=view),
        build_capgen(
            logs("capgen"),
            settings,
            provider=capgen_provider,
            sandbox=sandbox,
            config=capconfig,
        ),
        *guards,
        router,
        Reloader(logs("reloader"), view=view, config_dir=config_dir(settings)),
        *([HooksHandler(logs("hooks"), hooks=hooks)] if hooks.at("run_end") else []),
    ]
    mode = os.environ.get("NANOCRAB_TELEMETRY", "on")
    if mode == "off":  # no GenAI spans, metrics, alerts
        return loop
    watched = [r.name for r in loop]
    return [*loop, telemetry_handler(logs("telemetry"), settings, watched, live=mode == "live")]


def telemetry_handler(
    log: EventLog, settings: Settings, watched: list[str], *, live: bool = False
) -> Reactor:
    """GenAI spans, metrics and alerts from the log (docs/observability.md). Message content
    on spans only with ``NANOCRAB_TRACE_CONTENT=1``; a lag alert when a handler is more than
    ``NANOCRAB_LAG_ALERT`` events behind (default 1000); ``live`` (``NANOCRAB_TELEMETRY=live``):
    each span exported as it ends rather than with its run."""
    from nanocrab.observe import TelemetryHandler, configure_telemetry
    from nanocrab.observe.export import configured

    if settings.traces == "otlp" and not configured():  # metrics beside the spans
        configure_telemetry("nanocrab", otlp_metrics=True)
    sink = AlertSink(settings.alert_webhook) if settings.alert_webhook else None
    return TelemetryHandler(
        log,
        content=os.environ.get("NANOCRAB_TRACE_CONTENT", "") in ("1", "true", "yes"),
        alerts=sink,
        handlers=watched,
        lag_threshold=int(os.environ.get("NANOCRAB_LAG_ALERT", "1000")),
        live=live,
    )


def search_provider(settings: Settings) -> SearchProvider | None:
    """The ``web_search`` provider the settings configure; ``None`` without an API key."""
    if settings.search_api_key is None:
        return None
    return make_search_provider(
        settings.search_provider,
        settings.search_api_key.get_secret_value(),
        endpoint=settings.search_url,
    )


def config_dir(settings: Settings) -> Path:
    """The directory the reloader watches: ``NANOCRAB_CONFIG_DIR``, else ``<home>``."""
    named = os.environ.get("NANOCRAB_CONFIG_DIR")
    return Path(named) if named else settings.home


def config_view(
    settings: Settings,
    log: EventLog,
    skills: SkillLibrary,
    policy: Policy,
    chain: Chain | None,
    skill_dirs: list[Path],
) -> ConfigView:
    """The versioned configuration view of this process: the start-up version is what the
    settings name (``policy``, ``chain``, ``skills`` as loaded); versions activated later
    are read from the log, materialized under ``<home>/config-versions``."""
    agents_path = agents_file(settings.home, os.environ)
    base = BaseConfig(
        policy_file=settings.policy_file, guardrails_file=settings.guardrails_file,
        guardrails=settings.guardrails, agents_file=agents_path, skill_dirs=tuple(skill_dirs),
    )  # fmt: skip
    startup = LoadedConfig(
        version="", policy=policy,
        guardrails=chain.config if chain is not None else None, guardrails_text=None,
        agents=load_agents(agents_path) if agents_path is not None else None, skills=skills,
    )  # fmt: skip
    return ConfigView(startup, base=base, cache_dir=settings.home / "config-versions", log=log)


def run_tenants(log: EventLog) -> RunTenant:
    """The ``recall`` tool's tenant: the calling run's, from its ``task.submitted`` in the log
    (a tool call knows its run, not its tenant; an event stored on another tenant's subject is
    never folded, ``bus/placement.py``). ``None`` for a run with no task in the log."""
    runs = RunLoader(log, capacity=64)

    async def tenant_of(run_id: str) -> str | None:
        task = (await runs.state(run_id)).task if run_id else None
        return task.tenant if task is not None else None

    return tenant_of


def run_start_recall(engine: AsyncEngine, environ: Mapping[str, str]) -> Recaller | None:
    """Similar-task recall on a run's first model call (docs/memory.md): ``NANOCRAB_RECALL``
    ``off``, or the least cosine score to recall (default 0.6)."""
    named = environ.get("NANOCRAB_RECALL", "").strip()
    if named == "off":
        return None
    try:
        least = float(named) if named else 0.6
    except ValueError as exc:
        raise ValueError(f"NANOCRAB_RECALL={named!r}: use 'off' or a score such as 0.6") from exc
    return recaller(engine, min_score=least)


def routing_config(settings: Settings) -> AgentsConfig | None:
    """The agents of ``agents.yaml`` (``NANOCRAB_AGENTS``, else ``<home>/agents.yaml``) when it
    declares more than one, their profiles installed; ``None``: no routing, no router hop. A bad
    file raises :class:`~nanocrab.routing.AgentsError` (file:line)."""
    path = agents_file(settings.home, os.environ)
    if path is None:
        return None
    config = load_agents(path)
    install_profiles(config)
    return config if config.routed else None


def guardrails_chain(settings: Settings) -> Chain | None:
    """The guardrails chain the settings name: ``guardrails_file``, else the bundled default;
    ``None`` when guardrails are off. A bad file raises :class:`GuardrailsError` (file:line)."""
    if not settings.guardrails:
        return None
    path = settings.guardrails_file
    return Chain.of(load_guardrails(path), path.read_text("utf-8") if path else None)
