"""A real policy handler + executor on the real bus, driven by hand-written runs.

Runs are written as the orchestrator and the model would write them (task, run start, a model
turn asking for a tool, ``tool.requested``), so each adversarial case controls exactly what
reaches the policy and the executor; the audit projection runs alongside.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog, read_run
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.cli.host import Host
from nanocrab.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Capability,
    Event,
    LlmRequested,
    LlmResponded,
    RunStarted,
    TaskSubmitted,
    ToolRequested,
    ToolUseBlock,
    new_event_id,
)
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.policy import PermissionLookup, PolicyHandler, trusted_approvers
from nanocrab.policy import Policy
from nanocrab.projections import AuditProjection, AuditRow, audit_rows
from nanocrab.security import KeyRing, sign
from nanocrab.tools import LocalOperations
from nanocrab.tools.base import Tool
from tests.agent_fixtures import FAST, registry
from tests.conftest import eventually


@dataclass
class Rig:
    log: EventLog
    engine: AsyncEngine
    keys: KeyRing
    workspace: Path
    policy: Policy
    host: Host | None = None
    turns: dict[str, int] = field(default_factory=dict)
    handler: PolicyHandler | None = None

    async def start_run(
        self,
        *,
        session_id: str | None = None,
        parent_run_id: str | None = None,
        parent_session_id: str | None = None,
        capabilities: list[Capability] | None = None,
        agent: str = "default",
        workspace: Path | None = None,
    ) -> str:
        rid = new_event_id()
        sid = session_id or new_event_id()
        common: dict[str, Any] = {"run_id": rid, "task_id": rid, "session_id": sid}
        task = TaskSubmitted(
            text="security case", workspace=str(workspace or self.workspace), agent=agent,
            parent_run_id=parent_run_id, parent_session_id=parent_session_id,
            capabilities=capabilities, **common,
        )  # fmt: skip
        await self.log.append(task)
        await self.log.append(RunStarted(source="orchestrator", agent=agent, **common))
        self.turns[rid] = 0
        return rid

    async def call(self, run_id: str, tool: str, arguments: dict[str, Any]) -> str:
        """A model turn asking for one tool call, and the orchestrator's request for it."""
        turn = self.turns[run_id]
        self.turns[run_id] = turn + 1
        call_id = f"toolu_{new_event_id()}"
        sid = (await self.task(run_id)).session_id
        common: dict[str, Any] = {"run_id": run_id, "task_id": run_id, "session_id": sid}
        await self.log.append_batch(
            [
                LlmRequested(turn=turn, source="orchestrator", **common),
                LlmResponded(
                    provider="scripted", model="m", stop_reason="tool_use", turn=turn,
                    content=[ToolUseBlock(id=call_id, name=tool, input=arguments)],
                    source="llm", **common,
                ),
                ToolRequested(
                    call_id=call_id, tool=tool, arguments=arguments, source="orchestrator",
                    **common,
                ),
            ]
        )  # fmt: skip
        return call_id

    async def task(self, run_id: str) -> TaskSubmitted:
        for s in await read_run(self.log, run_id):
            if isinstance(s.event, TaskSubmitted):
                return s.event
        raise AssertionError(f"no task in {run_id}")

    async def events(self, run_id: str) -> list[Event]:
        return [s.event for s in await read_run(self.log, run_id) if s.event is not None]

    async def wait(
        self, run_id: str, kind: type | tuple[type, ...], where: Callable[[Any], bool] = bool,
        timeout: float = 30.0,
    ) -> Any:  # fmt: skip
        async def found() -> Any:
            return next(
                (e for e in await self.events(run_id) if isinstance(e, kind) and where(e)), None
            )

        return await eventually(found, timeout=timeout)

    async def outcome(self, run_id: str, call_id: str) -> Event:
        """The call's end as the policy/executor decided it: a denial or a completion."""
        from nanocrab.events import GrantDenied, ToolCompleted

        return await self.wait(run_id, (GrantDenied, ToolCompleted), lambda e: e.call_id == call_id)

    async def approval(self, run_id: str, call_id: str) -> ApprovalRequested:
        return await self.wait(run_id, ApprovalRequested, lambda e: e.call_id == call_id)

    def answer(
        self,
        request: ApprovalRequested,
        *,
        grant: bool = True,
        remember: str = "once",
        identity: str = "approver",
        at: datetime | None = None,
        **changes: Any,
    ) -> ApprovalGranted | ApprovalDenied:
        """A signed answer (given ``at`` a time, if set); ``changes`` are made after signing."""
        common: dict[str, Any] = {
            "approval_id": request.approval_id, "approver": identity,
            "binding_hash": request.binding_hash, "run_id": request.run_id,
            "session_id": request.session_id, "task_id": request.task_id, "source": "approver",
            **({"time": at} if at is not None else {}),
        }  # fmt: skip
        answer: ApprovalGranted | ApprovalDenied = (
            ApprovalGranted(remember=remember, **common)  # type: ignore[arg-type]
            if grant
            else ApprovalDenied(reason="no", **common)
        )
        signed = sign(answer, self.keys.keypair(identity))
        return msgspec.structs.replace(signed, **changes) if changes else signed

    async def audit(self, call_id: str, where: Callable[[AuditRow], bool] = bool) -> AuditRow:
        async def row() -> AuditRow | None:
            for r in await audit_rows(self.engine):
                if r.call_id == call_id and where(r):
                    return r
            return None

        return await eventually(row, timeout=10)


@contextlib.asynccontextmanager
async def security_rig(
    log: EventLog,
    engine: AsyncEngine,
    tmp_path: Path,
    policy: Policy,
    *,
    tools: Sequence[Tool] = (),
    capability_permissions: PermissionLookup | None = None,
) -> AsyncIterator[Rig]:
    workspace = (tmp_path / "ws").resolve()
    workspace.mkdir(exist_ok=True)
    keys = KeyRing(tmp_path / "keys")
    reg = registry(*tools)
    handler = PolicyHandler(
        log, policy=policy, keys=keys, known_tools=frozenset(reg.names()),
        default_workspace=workspace, watch_interval_s=0.05,
        capability_permissions=capability_permissions,
    )  # fmt: skip
    executor = Executor(
        log, registry=reg, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
        default_workspace=workspace, tool_timeout_s=20,
        trusted_policy=frozenset({keys.public_key("policy")}),
        trusted_approvers=trusted_approvers(policy, keys),
    )  # fmt: skip
    host = Host(log, engine, [handler, executor], projections=[AuditProjection()], options=FAST)
    await host.start()
    try:
        yield Rig(log, engine, keys, workspace, policy, host=host, handler=handler)
    finally:
        await host.stop(drain_s=5)
