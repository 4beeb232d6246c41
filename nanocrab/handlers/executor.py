"""The executor: runs a tool call only against a matching, unexpired grant from the policy.

Consumes ``grant.issued`` (run the call) and hears the run's terminal events on a plain
subscription (abort what is still running for that run, in every executor instance). Emits
``tool.started`` at once, ``tool.output`` chunks on the ephemeral stream while the tool runs,
and ``tool.completed`` as its reaction (a result too large for an event keeps a preview and
goes to the object store whole). It refuses — and records why,
as a ``tool.completed`` with ``error_kind="denied"`` — any grant that was not issued by the policy
handler, names another tool, has expired or been revoked, or belongs to a finished run; a tool
call without a grant never reaches it at all.

Redelivery: a call already completed is not run again. A crash *while* a tool runs means the
grant is redelivered and the call runs again (at-least-once for host actions), with a second
``tool.started`` so the log shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec
import nats.errors
from nats.aio.msg import Msg

from nanocrab.bus import Delivery, EventLog, stamp
from nanocrab.events import (
    Event,
    EventDecodeError,
    GrantIssued,
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
_STARTED_ORDINAL = 10_000  # progress events are stamped outside the reaction ordinals (0..)
_OUTPUT_ORDINAL = 1_000_000


class Executor:
    name = "executor"
    consumes: tuple[type[Event], ...] = (GrantIssued,)
    concurrency = 32  # tool calls of different runs proceed side by side

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
        assert isinstance(event, GrantIssued)
        return await self._execute(event, delivery)

    async def background(self) -> None:
        """Abort running tools of runs that end. A plain NATS subscription, so *every* executor
        instance hears it (a durable consumer would hand the event to one of them only)."""
        subjects = [
            self.log.subjects.of_type("run.cancelled"),
            self.log.subjects.of_type("run.failed"),
        ]
        subs = [await self.log.nc.subscribe(s, cb=self._on_run_end) for s in subjects]
        try:
            await asyncio.Event().wait()
        finally:
            for sub in subs:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()

    async def _on_run_end(self, msg: Msg) -> None:
        try:
            event = self.log.codec.decode(msg.data)
        except EventDecodeError:
            return
        for cancel in self._running.get(event.run_id or "", {}).values():
            cancel.set()

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

    async def _execute(self, grant: GrantIssued, delivery: Delivery) -> Sequence[Event]:
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
        # one tool.started per delivery: a re-execution after a crash shows as a second start
        invocation = derive_event_id("invocation", grant.id, delivery.deliveries)
        started_event = ToolStarted(
            call_id=grant.call_id, tool=grant.tool, invocation_id=invocation,
            grant_id=grant.grant_id,
        )  # fmt: skip
        await self.log.append(
            stamp(self.name, grant, [started_event], first=_STARTED_ORDINAL + delivery.deliveries)[
                0
            ]
        )
        chunks = 0

        async def emit(stream: Literal["stdout", "stderr"], chunk: str) -> None:
            nonlocal chunks
            output = ToolOutput(call_id=grant.call_id, stream=stream, chunk=chunk)
            await self.log.append_nowait(
                stamp(self.name, grant, [output], first=_OUTPUT_ORDINAL + chunks)[0]
            )
            chunks += 1

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
        if state.terminal:
            cancel.set()
        started = time.perf_counter()
        try:
            result = await self.registry.invoke(grant.tool, call.requested.arguments, ctx)
        finally:
            self._running.get(grant.run_id, {}).pop(grant.call_id, None)
            if not self._running.get(grant.run_id):
                self._running.pop(grant.run_id, None)
        completed = ToolCompleted(
            call_id=grant.call_id,
            tool=grant.tool,
            is_error=result.is_error,
            error_kind=result.error_kind,
            content=list(result.content),
            details=result.details,
            artifacts=list(result.artifacts),
            duration_ms=(time.perf_counter() - started) * 1000,
        )
        return [await self._fit(completed)]

    async def _fit(self, completed: ToolCompleted) -> ToolCompleted:
        """A result too large for one event keeps a preview; the full text becomes an artifact."""
        try:
            self.log.codec.encode(completed)
            return completed
        except EventDecodeError:
            pass
        text = "\n".join(b.text for b in completed.content if isinstance(b, TextBlock))
        ref = await self.artifacts.put(
            f"{completed.tool}-{completed.call_id}.txt", text.encode(), preview=text[:2000]
        )
        budget = self.log.codec.max_bytes // 4
        note = (
            f"\n[… output truncated: {len(text)} characters in all, stored as artifact "
            f"{ref.key}; ask for a narrower read (offset/limit, a pattern) to see more]"
        )
        return msgspec.structs.replace(
            completed,
            content=[TextBlock(text[:budget] + note)],
            details=None,
            artifacts=[*completed.artifacts, ref],
        )
