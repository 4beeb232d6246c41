"""The executor: runs a tool call only against a matching, unexpired grant from the policy.

Consumes ``grant.issued`` (run the call) and the run's terminal events (abort what is still
running for that run). Emits ``tool.started`` at once, ``tool.output`` chunks on the ephemeral
stream while the tool runs, and ``tool.completed`` as its reaction. It refuses — and records why,
as a ``tool.completed`` with ``error_kind="denied"`` — any grant that was not issued by the policy
handler, names another tool, has expired or been revoked, or belongs to a finished run; a tool
call without a grant never reaches it at all.

Redelivery: a call already completed is not run again. A crash *while* a tool runs means the
grant is redelivered and the call runs again (at-least-once for host actions).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from nanocrab.bus import Delivery, EventLog
from nanocrab.events import (
    Event,
    GrantIssued,
    RunCancelled,
    RunFailed,
    TextBlock,
    ToolCompleted,
    ToolOutput,
    ToolStarted,
    derive_event_id,
    utcnow,
)
from nanocrab.handlers.orchestrator.spawn import NATIVE_TOOLS
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.runstate import RunState
from nanocrab.handlers.workspace import workspace_of
from nanocrab.tools.base import ArtifactStore, ToolContext
from nanocrab.tools.ops import Operations
from nanocrab.tools.registry import ToolRegistry

GRANT_ISSUER = "policy"
_STARTED_ORDINAL = 10_000  # tool.started is appended directly, outside the reaction ordinals


class Executor:
    name = "executor"
    consumes: tuple[type[Event], ...] = (GrantIssued, RunCancelled, RunFailed)
    concurrency = 32  # tool calls of different runs (and cancellations) proceed side by side

    def __init__(
        self,
        log: EventLog,
        *,
        registry: ToolRegistry,
        ops: Operations,
        artifacts: ArtifactStore,
        default_workspace: Path,
        tool_timeout_s: float = 120.0,
    ) -> None:
        self.log = log
        self.loader = RunLoader(log)
        self.registry = registry
        self.ops = ops
        self.artifacts = artifacts
        self.default_workspace = default_workspace
        self.tool_timeout_s = tool_timeout_s
        self._running: dict[str, dict[str, asyncio.Event]] = {}

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        match event:
            case GrantIssued():
                return await self._execute(event)
            case RunCancelled() | RunFailed():
                for cancel in self._running.get(event.run_id or "", {}).values():
                    cancel.set()
                return []
            case _:
                return []

    def _refusal(self, state: RunState, grant: GrantIssued) -> str | None:
        if grant.source != GRANT_ISSUER:
            return f"grant {grant.grant_id} was issued by {grant.source!r}, not by the policy"
        call = state.call(grant.call_id)
        if call is None or call.requested is None:
            return f"no tool.requested {grant.call_id} in this run matches grant {grant.grant_id}"
        if call.requested.tool != grant.tool:
            return (
                f"grant {grant.grant_id} is for {grant.tool!r}, the call is {call.requested.tool!r}"
            )
        if grant.expires_at <= utcnow():
            return f"grant {grant.grant_id} expired at {grant.expires_at:%H:%M:%S}"
        if grant.grant_id in state.revoked:
            return f"grant {grant.grant_id} was revoked"
        if state.terminal:
            return f"the run is {state.status}"
        return None

    async def _execute(self, grant: GrantIssued) -> Sequence[Event]:
        if grant.tool in NATIVE_TOOLS or grant.run_id is None:
            return []
        state = await self.loader.state(grant.run_id)
        call = state.call(grant.call_id)
        if call is not None and call.completed is not None:
            return []  # already ran: a redelivery
        refusal = self._refusal(state, grant)
        if refusal is not None:
            return [
                ToolCompleted(
                    call_id=grant.call_id,
                    tool=grant.tool,
                    is_error=True,
                    error_kind="denied",
                    content=[TextBlock(f"refused: {refusal}")],
                )
            ]
        assert call is not None and call.requested is not None and state.task is not None
        cancel = asyncio.Event()
        self._running.setdefault(grant.run_id, {})[grant.call_id] = cancel
        await self.log.append(
            ToolStarted(
                id=derive_event_id(self.name, grant.id, _STARTED_ORDINAL),
                source=self.name,
                call_id=grant.call_id,
                tool=grant.tool,
                invocation_id=derive_event_id("invocation", grant.id, 0),
                grant_id=grant.grant_id,
                causation_id=grant.id,
                run_id=grant.run_id,
                task_id=grant.task_id,
                session_id=grant.session_id,
                step_id=grant.step_id,
                trace=grant.trace,
            )
        )
        chunks = 0

        async def emit(stream: Literal["stdout", "stderr"], chunk: str) -> None:
            nonlocal chunks
            chunks += 1
            await self.log.append_nowait(
                ToolOutput(
                    call_id=grant.call_id, stream=stream, chunk=chunk, run_id=grant.run_id,
                    source=self.name, causation_id=grant.id,
                )
            )  # fmt: skip

        ctx = ToolContext(
            workspace=workspace_of(state.task, self.default_workspace),
            ops=self.ops,
            artifacts=self.artifacts,
            emit_output=emit,
            cancel=cancel,
            timeout_s=self.tool_timeout_s,
            run_id=grant.run_id,
            call_id=grant.call_id,
        )
        started = time.perf_counter()
        try:
            result = await self.registry.invoke(grant.tool, call.requested.arguments, ctx)
        finally:
            self._running.get(grant.run_id, {}).pop(grant.call_id, None)
            if not self._running.get(grant.run_id):
                self._running.pop(grant.run_id, None)
        return [
            ToolCompleted(
                call_id=grant.call_id,
                tool=grant.tool,
                is_error=result.is_error,
                error_kind=result.error_kind,
                content=list(result.content),
                details=result.details,
                artifacts=list(result.artifacts),
                duration_ms=(time.perf_counter() - started) * 1000,
            )
        ]
