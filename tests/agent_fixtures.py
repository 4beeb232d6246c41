"""Wiring the real agent loop (orchestrator, policy, executor, LLM handler) for tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from pathlib import Path

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.backends import Backend
from nanocrab.bus import EventLog, Reactor, RuntimeOptions, read, read_run
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.cli.host import Host
from nanocrab.events import (
    Event,
    RunCancelled,
    RunCompleted,
    RunFailed,
    TaskSubmitted,
    new_event_id,
)
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.guardrails import Chain, GuardrailsHandler, Prescreener
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator, SpawnTool
from nanocrab.handlers.orchestrator.plan import PlanTool
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.handlers.sessions import SessionIndex
from nanocrab.llm.base import DeltaSink, ModelRequest, ModelResponse, Provider
from nanocrab.policy import Policy
from nanocrab.projections.sessions import session_snapshot
from nanocrab.security import KeyRing, signed_by
from nanocrab.skills import SkillLibrary, SkillTool, bundled_skills_dir
from nanocrab.tools import LocalOperations, ToolRegistry, default_tools
from nanocrab.tools.base import Tool

FAST = RuntimeOptions(fetch_timeout_s=0.5, ack_wait_s=5.0, backoff_s=(0.1, 0.2), max_deliver=4)


# The agent-loop tests exercise the loop, not the rules: everything in the workspace is Safe.
# (tests/test_security.py drives the real tiers, approvals and refusals.)
OPEN_POLICY = Policy.from_mapping(
    {
        "version": 1,
        "rules": [
            {"id": "workspace", "tools": ["read", "write", "edit", "ls", "glob", "grep"],
             "paths": ["${workspace}"], "tier": "safe"},
            {"id": "shell", "tools": ["exec"], "tier": "safe"},
            {"id": "agent", "tools": ["skill", "spawn", "web_fetch"], "tier": "safe"},
        ],
    },
    source="tests/agent_fixtures.py",
)  # fmt: skip


def registry(*extra: Tool) -> ToolRegistry:
    skills = SkillLibrary.discover([bundled_skills_dir()])
    return ToolRegistry([*default_tools(), SkillTool(skills), SpawnTool(), PlanTool(), *extra])


def agent_reactors(
    log: EventLog,
    engine: AsyncEngine,
    provider: Provider,
    workspace: Path,
    *,
    policy: bool = True,
    orchestrators: Sequence[str] = ("orchestrator",),
    rules: Policy = OPEN_POLICY,
    keys: KeyRing | None = None,
    guardrails: Chain | None = None,
    prescreen: bool = False,
    backends: Mapping[str, Backend] | None = None,
) -> list[Reactor]:
    reg = registry()
    keys = keys or KeyRing(workspace.parent / f"{workspace.name}-keys")
    policy_keys = frozenset({keys.public_key("policy")})

    history = SessionIndex(log, snapshot=partial(session_snapshot, engine))

    screener = Prescreener(guardrails) if prescreen and guardrails is not None else None
    reactors: list[Reactor] = [
        Orchestrator(
            log, name=n, trust=signed_by(policy_keys),
            guarded=guardrails.guarded() if guardrails is not None else frozenset(),
            prescreen=screener,
        )
        for n in orchestrators
    ]  # fmt: skip
    if guardrails is not None and guardrails.guarded():
        reactors.append(GuardrailsHandler(log, chain=guardrails, prescreen=screener))
    if policy:
        reactors.append(
            PolicyHandler(
                log,
                policy=rules,
                keys=keys,
                known_tools=frozenset(reg.names()),
                default_workspace=workspace,
            )
        )
    reactors += [
        Executor(log, registry=reg, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
                 default_workspace=workspace, tool_timeout_s=20, trusted_policy=policy_keys,
                 trusted_approvers=trusted_approvers(rules, keys), backends=backends),
        LlmHandler(log, provider=provider, registry=reg, default_workspace=workspace,
                   skills=SkillLibrary.discover([bundled_skills_dir()]), history=history,
                   backoff_s=0.01, backoff_max_s=0.05, prescreen=screener),
    ]  # fmt: skip
    return reactors


@contextlib.asynccontextmanager
async def running_host(
    log: EventLog, engine: AsyncEngine, reactors: Sequence[Reactor]
) -> AsyncIterator[Host]:
    host = Host(log, engine, reactors, options=FAST)
    await host.start()
    try:
        yield host
    finally:
        await host.stop(drain_s=5)


def submit(text: str, workspace: Path, **kw: object) -> TaskSubmitted:
    rid = new_event_id()
    return TaskSubmitted(
        text=text, run_id=rid, task_id=rid, workspace=str(workspace),
        session_id=kw.pop("session_id", None) or new_event_id(), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


async def finished(log: EventLog, run_id: str, timeout: float = 30.0) -> list[Event]:
    """Wait for the run's terminal event; return all of its events."""

    async def wait() -> None:
        async for s in read(log, log.subjects.run(run_id), follow=True):
            if isinstance(s.event, RunCompleted | RunFailed | RunCancelled):
                return

    try:
        await asyncio.wait_for(wait(), timeout)
    except TimeoutError:
        seen = [s.event for s in await read_run(log, run_id) if s.event is not None]
        trail = "\n  ".join(_describe(e) for e in seen)
        raise AssertionError(
            f"run {run_id} did not end in {timeout} s; its events:\n  {trail}"
        ) from None
    return [s.event for s in await read_run(log, run_id) if s.event is not None]


def _describe(event: Event) -> str:
    fields = {k: v for k, v in msgspec.structs.asdict(event).items()
              if k in {"checkpoint", "target_id", "action", "call_id", "name", "causation_id",
                       "id", "is_error", "error_kind", "stop_reason"}}  # fmt: skip
    return f"{type(event).__name__} {fields}"


def of_type(events: Sequence[Event], cls: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, cls)]


class Recording:
    """A provider (the scripted model) that keeps every request it was sent: what the model
    was told."""

    name = "scripted"

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.requests: list[ModelRequest] = []

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        return await self.inner.complete(request, on_delta=on_delta)

    def seen(self) -> str:
        """Every request, JSON-encoded, one per line (to search what the model saw)."""
        return "\n".join(msgspec.json.encode(r).decode() for r in self.requests)
