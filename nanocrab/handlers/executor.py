"""The executor: runs a tool call only against a matching, unexpired grant from the policy.

Consumes ``grant.issued`` (run the call) and hears the run's terminal events on a plain
subscription (abort what is still running for that run, in every executor instance). Emits
``tool.started`` at once, ``tool.output`` chunks on the ephemeral stream while the tool runs,
and ``tool.completed`` as its reaction (a result too large for an event keeps a preview and
goes to the object store whole).

Before every invocation it verifies the grant: a grant not signed by a trusted policy key is a
forgery — recorded as ``security.rejected``, and the call keeps waiting for a real grant. A signed
grant that names another tool, has expired or been revoked (even by a revocation that arrived
first), belongs to a finished run, is not bound (``binding_hash``, every tier) to exactly the call
it is about to run, or — Guarded/Unsafe — rests on an approval that no trusted approver signed
for exactly this call is refused, recorded as a ``tool.completed`` with ``error_kind="denied"``
saying why. What runs is the model's call: the tool and arguments of its ``tool_use`` block in
``llm.responded``, which the run's fold also requires of the ``tool.requested`` the policy
decided on. Only the first grant event of a call is acted on (a grant stored again under another
event id changes nothing). A tool call without a grant never reaches the executor at all. Web
hosts a grant allows are enforced on every redirect hop. Events of the run the fold did not
believe (stored on another subject than their own, or a ``tool.requested`` that is not the
model's call) are reported once each as ``security.rejected``.

Redelivery never runs a side effect twice. A call already completed is not run again. A call
this process is running (the grant redelivered, or stored twice) is left to that invocation: the
redelivery waits for it, then finds the completion in the log. A call whose ``tool.started`` is in
the log without a completion, and which no invocation here is running, was interrupted (the
executor died mid-call): it is not run again but completed with ``error_kind="interrupted"`` —
its effects are unknown, the model decides what to do — unless the tool is idempotent
(``Tool.idempotent``: read, ls, glob, grep), which is simply run again with a second
``tool.started``. The outcome is appended before the call is released, so a waiting redelivery
always sees it. (Within one process the runtime's in-progress acks keep a running call from being
redelivered at all; the rules above cover a lost connection and a restart.) Two instances given
the same grant at once (redelivered while the first still works: its in-progress acks went to a
consumer leader that has since moved) may both read the run before either started the call; a
call that is not idempotent has one ``tool.started`` id, so the log stores the first append and
reports the second a duplicate: that instance leaves the call alone, and its redelivery finds
the completion (or the start alone: interrupted).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec
import nats.errors
from nats.aio.msg import Msg

from nanocrab.bus import Appended, BusError, Delivery, EventLog, TransientError, stamp
from nanocrab.events import (
    AlertRaised,
    ApprovalGranted,
    CapabilityDetails,
    CapabilityInvoked,
    Event,
    EventDecodeError,
    GrantIssued,
    SecurityRejected,
    TextBlock,
    ToolCompleted,
    ToolOutput,
    ToolStarted,
    derive_event_id,
    utcnow,
)
from nanocrab.handlers import plan_approval
from nanocrab.handlers.alerts import AlertSink
from nanocrab.handlers.orchestrator.spawn import NATIVE_TOOLS
from nanocrab.handlers.runloader import RunLoader, report_rejected
from nanocrab.handlers.runstate import CallState, RunState
from nanocrab.handlers.workspace import workspace_of
from nanocrab.hooks import Hooks
from nanocrab.reload import ConfigView, pinned
from nanocrab.security import binding_hash, signed_by, verify
from nanocrab.tools.base import ArtifactStore, ToolContext, ToolError, is_idempotent
from nanocrab.tools.confine import Confinement
from nanocrab.tools.hosts import HostAllowList
from nanocrab.tools.ops import Operations
from nanocrab.tools.registry import ToolRegistry

if TYPE_CHECKING:  # the MCP SDK loads only where mcp.yaml declares a server
    from nanocrab.backends import Backend
    from nanocrab.mcp import McpHub

GRANT_ISSUER = "policy"
_STARTED_ORDINAL = 10_000  # progress events are stamped outside the reaction ordinals (0..)
_OUTPUT_ORDINAL = 1_000_000


@dataclass
class _Invocation:
    """A call this process is handling: ``cancel`` aborts its tool, ``done`` is set once its
    outcome is in the log."""

    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


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
        trusted_policy: frozenset[str],
        trusted_approvers: frozenset[str],
        tool_timeout_s: float = 120.0,
        confinement: Confinement = Confinement(),
        config: ConfigView | None = None,
        mcp: McpHub | None = None,
        notices: Sequence[Event] = (),
        hooks: Hooks | None = None,
        alert_sink: AlertSink | None = None,
        backends: Mapping[str, Backend] | None = None,
    ) -> None:
        """``config``: the versioned configuration; a tool reading it (the ``skill`` tool's
        library) serves the version the call's run is pinned to (``run.started.config``).
        ``mcp``: the sessions with the MCP servers (their credentials stay here), closed when
        the executor stops. ``notices``: events to append once when it starts (the alerts of
        MCP tools withheld at listing, docs/mcp.md); ``alert_sink``: the webhook their alerts
        are also posted to. ``backends``: the operations backend of each agent that has its own
        (``backends.yaml``: a remote host over SSH); other agents' calls use ``ops``. The
        backend's name goes into ``tool.started``; its connections close with the executor."""
        self.backends = dict(backends or {})
        self.mcp = mcp
        self.alert_sink = alert_sink
        self.hooks = hooks  # after_tool extension hooks (nanocrab/hooks)
        self.notices = list(notices)
        self.config = config
        self.confinement = confinement  # exec's sandbox as the policy sets it; the grant adds
        self.log = log
        self.trusted_policy = trusted_policy
        self.trusted_approvers = trusted_approvers
        self.loader = RunLoader(log, trust=signed_by(trusted_policy))
        self.registry = registry
        self.ops = ops
        self.artifacts = artifacts
        self.default_workspace = default_workspace
        self.tool_timeout_s = tool_timeout_s
        self._running: dict[tuple[str, str], _Invocation] = {}  # (run id, call id) → invocation

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
        posting: asyncio.Task[None] | None = None
        try:
            if self.notices:
                notices = [msgspec.structs.replace(e, source=self.name) for e in self.notices]
                await self.log.append_batch(notices)
                if self.alert_sink is not None:
                    for notice in notices:
                        if isinstance(notice, AlertRaised):
                            self.alert_sink.send(notice)
                    posting = asyncio.create_task(self.alert_sink.run())
            await asyncio.Event().wait()
        finally:
            if posting is not None:
                posting.cancel()
            for sub in subs:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
            if self.mcp is not None:
                await self.mcp.close()
            for backend in {id(b): b for b in self.backends.values()}.values():
                with contextlib.suppress(Exception):
                    await backend.close()

    async def _on_run_end(self, msg: Msg) -> None:
        try:
            event = self.log.decode(msg.data, subject=msg.subject)
        except EventDecodeError:
            return  # not an event, or not stored where its run's end belongs
        for (run_id, _), invocation in list(self._running.items()):
            if run_id == event.run_id:
                invocation.cancel.set()

    def _forgery(self, grant: GrantIssued) -> SecurityRejected | None:
        problem = verify(grant, self.trusted_policy)
        if problem is None and grant.source != GRANT_ISSUER:
            problem = f"grant {grant.grant_id} was appended by {grant.source!r}, not by the policy"
        if problem is None:
            return None
        return SecurityRejected(
            rejected_id=grant.id,
            rejected_type=grant.type,
            reason=problem,
            call_id=grant.call_id,
            approval_id=grant.approval_id,
            signer=grant.signer or None,
        )

    def _refusal(self, state: RunState, grant: GrantIssued) -> str | None:
        call = state.call(grant.call_id)
        if call is None or call.requested is None:
            return f"no tool.requested {grant.call_id} in this run matches grant {grant.grant_id}"
        if call.tool != grant.tool:
            return f"grant {grant.grant_id} is for {grant.tool!r}, the call is {call.tool!r}"
        if grant.expires_at <= utcnow():
            return f"grant {grant.grant_id} expired at {grant.expires_at:%H:%M:%S}"
        if grant.grant_id in state.revoked:
            return f"grant {grant.grant_id} was revoked"
        if state.terminal:
            return f"the run is {state.status}"
        return self._binding_refusal(state, grant, call.arguments)

    def _binding_refusal(
        self, state: RunState, grant: GrantIssued, arguments: dict[str, object]
    ) -> str | None:
        """Every grant must be bound to exactly the call about to run (the model's tool and
        arguments, the grant's resources, its nonce); a Guarded/Unsafe one must also rest on an
        approval a trusted approver signed for that binding."""
        if not grant.binding_hash or not grant.nonce:
            return f"{grant.tier} grant {grant.grant_id} is not bound to the call"
        resources = [c.resource for c in grant.capabilities]
        if binding_hash(grant.tool, arguments, resources, grant.nonce) != grant.binding_hash:
            return f"grant {grant.grant_id} is bound to other arguments than the call's"
        if grant.tier == "safe":
            return None
        if grant.approval_id is None:
            return f"{grant.tier} grant {grant.grant_id} names no approval"
        if grant.remembered:
            return None  # a session approval of an earlier call; the policy's signature vouches
        request = state.approvals.get(grant.approval_id)
        if request is not None and plan_approval.asked(request) and state.task is not None:
            workspace = workspace_of(state.task, self.default_workspace)
            answers = state.answers.get(grant.approval_id, [])
            return plan_approval.vouches(request, answers, grant, self.trusted_approvers, workspace)
        for answer in state.answers.get(grant.approval_id, []):
            if (
                isinstance(answer, ApprovalGranted)
                and answer.binding_hash == grant.binding_hash
                and verify(answer, self.trusted_approvers) is None
            ):
                return None
        return f"no trusted approver signed approval {grant.approval_id} for this call"

    async def _execute(self, grant: GrantIssued, delivery: Delivery) -> Sequence[Event]:
        if grant.tool in NATIVE_TOOLS or grant.run_id is None:
            return []
        if (forgery := self._forgery(grant)) is not None:
            return [forgery]
        key = (grant.run_id, grant.call_id)
        while (other := self._running.get(key)) is not None:
            await other.done.wait()  # this process is settling the call: wait, then look again
        mine = self._running[key] = _Invocation()
        try:
            outcome = await self._settle(grant, delivery, mine.cancel)
            # appended before the call is released, so a waiting redelivery sees it
            await self.log.append_batch(stamp(self.name, grant, outcome))
        except BusError as exc:
            # redelivered later: the log then says whether the tool started (→ interrupted)
            raise TransientError(f"call {grant.call_id}: {exc}") from exc
        finally:
            del self._running[key]
            mine.done.set()
        return []

    async def _settle(
        self, grant: GrantIssued, delivery: Delivery, cancel: asyncio.Event
    ) -> list[Event]:
        """What a trusted grant comes to: nothing (the call is settled already, or this is not
        its first grant event), a refusal, ``interrupted``, or the tool's result."""
        assert grant.run_id is not None
        state = await self.loader.state(grant.run_id)
        await self._report(grant, state)
        call = state.call(grant.call_id)
        if call is not None and call.completed is not None:
            return []  # already ran: a redelivery
        if call is not None and call.grant is not None and call.grant.id != grant.id:
            return []  # another grant for this call (or this one stored again) came first
        if call is not None and call.started is not None and not self._idempotent(grant.tool):
            return [_interrupted(call)]
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
        assert call is not None
        return await self._run(state, call, grant, delivery, cancel)

    def _idempotent(self, tool: str) -> bool:
        try:
            return is_idempotent(self.registry.get(tool))
        except ToolError:
            return False  # unknown: the invocation reports it, nothing ran

    async def _report(self, grant: GrantIssued, state: RunState) -> None:
        """Record each event of the run its fold did not believe as ``security.rejected``, once
        per stored event (the report's id derives from the event's stream sequence)."""
        await report_rejected(self.log, self.name, grant, state)

    async def _run(
        self,
        state: RunState,
        call: CallState,
        grant: GrantIssued,
        delivery: Delivery,
        cancel: asyncio.Event,
    ) -> list[Event]:
        """Invoke the model's call (``call.arguments``) under ``grant``: ``tool.started``, output
        chunks, then the result (and the capability record) to append."""
        assert grant.run_id is not None and state.task is not None
        # An idempotent call re-run after a crash starts again: one tool.started per delivery.
        # Any other call has one tool.started id, so the log's duplicate window settles which of
        # two instances given the grant at once (a redelivery while the first still works, e.g.
        # after the consumer's leader moved) runs it: the one whose append stored it.
        idempotent = self._idempotent(grant.tool)
        attempt = delivery.deliveries if idempotent else 0
        invocation = derive_event_id("invocation", grant.id, attempt)
        # the run's agent's backend (backends.yaml), else this host's
        backend = self.backends.get(state.started.agent) if state.started is not None else None
        started_event = ToolStarted(
            call_id=grant.call_id, tool=grant.tool, invocation_id=invocation,
            grant_id=grant.grant_id, backend=backend.name if backend is not None else None,
        )  # fmt: skip
        started_stamped = stamp(
            self.name, grant, [started_event], first=_STARTED_ORDINAL + attempt
        )[0]
        # A tool that is not idempotent runs only once its tool.started is stored: a crash after
        # that is reported as ``interrupted``, never run again. An idempotent one may run while
        # the append is on its way (it would simply run again); its result is appended only after
        # tool.started is acknowledged, so the log still has them in that order.
        started_append: asyncio.Task[Appended] | None = None
        if idempotent:
            started_append = asyncio.ensure_future(self.log.append(started_stamped))
        elif (await self.log.append(started_stamped)).duplicate:
            # stored before: by another instance running it now, or by an earlier delivery
            # whose append's acknowledgement was lost. Not run here; redelivered later, the
            # log then holds its completion, or its start alone (-> interrupted).
            raise TransientError("its tool.started is stored already, by another invocation")
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
            ops=backend.ops if backend is not None else self.ops,
            artifacts=self.artifacts,
            emit_output=emit,
            cancel=cancel,
            timeout_s=self.tool_timeout_s,
            run_id=grant.run_id,
            call_id=grant.call_id,
            allowed_hosts=_granted_hosts(grant),
            confinement=self.confinement.for_grant(grant.tier, grant.capabilities),
            granted=tuple(c.resource for c in grant.capabilities if c.resource is not None),
        )
        if state.terminal:
            cancel.set()
        started = time.perf_counter()
        version = state.started.config if state.started is not None else ""
        if self.config is not None:
            await self.config.ensure(version)
        try:
            with pinned(version):
                result = await self.registry.invoke(grant.tool, call.arguments, ctx)
        finally:
            if started_append is not None:
                await started_append  # a BusError: retried, and an idempotent call runs again
        applied: list[Event] = []
        if self.hooks:  # extension hooks may change what the model reads; each is an event
            agent = state.started.agent if state.started is not None else None
            result, hooked = await self.hooks.after_result(
                result, run_id=grant.run_id, call_id=grant.call_id, tool=grant.tool, agent=agent
            )
            applied.extend(hooked)
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
        out: list[Event] = [await self._fit(completed), *applied]
        if isinstance(result.details, CapabilityDetails):
            d = result.details  # the registry's statistics come from this record
            invoked = CapabilityInvoked(
                name=d.name, version=d.version, ok=d.ok, outcome=d.outcome,
                duration_ms=d.duration_ms, peak_memory_bytes=d.peak_memory_bytes,
                fuel_used=d.fuel_used, error=d.error,
            )  # fmt: skip
            out.append(invoked)
        return out

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


def _interrupted(call: CallState) -> ToolCompleted:
    """The result of a call whose earlier invocation started and never completed."""
    assert call.started is not None
    text = (
        f"interrupted: {call.tool} was started at {call.started.time:%Y-%m-%d %H:%M:%S} UTC and "
        "the executor stopped before it finished (a crash or restart). Its effects are unknown: "
        "it may have done all, part or none of its work. It was not run again; check the state "
        "(files, processes) before deciding whether to call it again."
    )
    return ToolCompleted(
        call_id=call.call_id,
        tool=call.tool,
        is_error=True,
        error_kind="interrupted",
        content=[TextBlock(text)],
    )


def _granted_hosts(grant: GrantIssued) -> HostAllowList | None:
    hosts = [c.resource for c in grant.capabilities if c.access == "network" and c.resource]
    return HostAllowList(hosts) if hosts else None
