"""The policy handler: the only minter of grants.

Consumes ``tool.requested`` (decide by the rules of ``policy.yaml``), the answers of approvers
(``approval.granted`` / ``approval.denied``) and the ends of runs. Emits ``grant.issued`` (signed
with the policy key), ``grant.denied``, ``approval.requested``, ``approval.expired``,
``grant.revoked`` and, for answers it cannot trust, ``security.rejected``.

Per tier: Safe → a grant at once. Deny → ``grant.denied`` naming the rule. Guarded → a grant at
once if this session already approved the rule "for the session" (never across sessions, never
for a subagent unless the rule shares), else ``approval.requested``. Unsafe → an approval for
every call; "for the session" is ignored. Every grant, Safe included, is bound to a hash of
(tool, arguments, resources, nonce) that the executor recomputes from the call it runs; for
Guarded/Unsafe the approval must repeat it. An answer is trusted only when signed
by a trusted approver key; the first trusted answer wins; answers for other arguments, after the
expiry or after the run ended never produce a grant. No answer by ``expires_at`` →
``approval.expired`` + ``grant.denied``. When a run ends, its grants are revoked and its open
approvals expire.

A run over a spending cap set to ``on_exceed: ask`` (``budget.exceeded``) is asked about the
same way: ``approval.requested{about: budget}``, answered by ``budget.raised`` (signed) or
``budget.refused`` instead of a grant (``handlers/budget_approval.py``).

Memory (session approvals, open approvals' deadlines) is replayed from the log at start-up and
then follows the log, so an approval requested while this process was down still expires.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from nanocrab.agents import enabled_tools
from nanocrab.bus import Delivery, EventLog, Expect, Reaction
from nanocrab.bus.errors import BusError
from nanocrab.bus.reactions import append_reaction
from nanocrab.bus.replay import Window, read
from nanocrab.capabilities.pin import Pinned, session_tool
from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    BudgetExceeded,
    BudgetRaised,
    BudgetRefused,
    Capability,
    Event,
    GrantDenied,
    GrantIssued,
    GrantRevoked,
    PlanStepStarted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    SecurityRejected,
    ToolRequested,
    derive_event_id,
    utcnow,
)
from nanocrab.handlers import budget_approval, plan_approval
from nanocrab.handlers.grants import deny as _deny
from nanocrab.handlers.grants import deny_call as _deny_call
from nanocrab.handlers.grants import raised as _raised
from nanocrab.handlers.grants import tier_for
from nanocrab.handlers.runloader import RunLoader, report_rejected
from nanocrab.handlers.runstate import CallState, RunState
from nanocrab.handlers.workspace import workspace_of
from nanocrab.policy import CallResources, Decision, Policy, Request, evaluate
from nanocrab.reload import ConfigView
from nanocrab.security import KeyRing, binding_hash, sign, verify

logger = logging.getLogger(__name__)

SessionKey = tuple[str, str, str, str]  # tenant, session, rule, tool
Remembered = tuple[str, str]
"""A session approval: its id and the run it was given in (whose workspace it covers)."""
PermissionLookup = Callable[[str], Awaitable[Pinned | None]]
"""What an enabled capability declares and the pin of its code (``capabilities/pin.py``);
``None`` for one that is unknown, disabled or removed."""
ResourcesOf = Callable[[str, Mapping[str, Any]], CallResources | None]  # connectors' resources
CAPABILITY_TOOL = "capability"
SESSION_CAPACITY = 4096
"""Session approvals kept in memory (most recently given first to stay)."""
_EXPIRY_ORDINAL = 100  # watchdog reactions are stamped outside the handler's ordinals
E = TypeVar("E", GrantIssued, BudgetRaised)


@dataclass
class _Open:
    """An approval waiting for its answer."""

    request: ApprovalRequested
    cause: Event  # what the watchdog's events are stamped from (the approval request)


def trusted_approvers(policy: Policy, keys: KeyRing) -> frozenset[str]:
    """The public keys whose answers count: policy.yaml's list, and the data directory's own
    approver key unless the policy turns that off."""
    trusted = set(policy.approval.approvers)
    if policy.approval.trust_local_approver:
        trusted.add(keys.public_key("approver"))
    return frozenset(trusted)


class PolicyHandler:
    name = "policy"
    consumes: tuple[type[Event], ...] = (
        ToolRequested,
        ApprovalGranted,
        ApprovalDenied,
        RunCompleted,
        RunFailed,
        RunCancelled,
        BudgetExceeded,
    )

    def __init__(
        self,
        log: EventLog,
        *,
        policy: Policy,
        keys: KeyRing,
        known_tools: frozenset[str],
        default_workspace: Path,
        watch_interval_s: float = 0.25,
        capability_permissions: PermissionLookup | None = None,
        protected: Sequence[Path] = (),
        config: ConfigView | None = None,
        tool_hosts: Mapping[str, str] | None = None,
        resources_of: ResourcesOf | None = None,
    ) -> None:
        """``capability_permissions`` says what an enabled capability declared (``None`` for
        one that is unknown, disabled or removed); without it the ``capability`` tool can only
        list them. ``config``: the versioned configuration; a call is decided by the rules of
        the version its run is pinned to (``run.started.config``), ``policy`` without it.
        Grant and approval lifetimes and the trusted approvers stay those of ``policy``.
        ``tool_hosts``: the fixed host each such tool reaches (``web_search`` → its provider's
        API host), decided like a ``web_fetch`` URL's host. ``resources_of``: what a connector
        call touches (``mail.to:example.org``; ``None`` for other tools, ``ValueError`` for
        arguments it cannot read), matched by rules' ``resources`` (docs/tools.md)."""
        self.log = log
        self.policy = policy
        self.config = config
        self.keypair = keys.keypair("policy")
        self._own = frozenset({self.keypair.public_key.decode()})  # what it signs
        self.approvers = trusted_approvers(policy, keys)
        self.known_tools = known_tools
        self.default_workspace = default_workspace
        self.capability_permissions = capability_permissions
        self.protected = tuple(str(p) for p in protected)  # no tool may touch these (data dir)
        self.tool_hosts = dict(tool_hosts or {})
        self.resources_of = resources_of
        self.watch_interval_s = watch_interval_s
        self.loader = RunLoader(log)
        self.grant_ttl = timedelta(seconds=policy.grant_ttl)
        self.approval_ttl = timedelta(seconds=policy.approval.timeout)
        self.sessions: OrderedDict[SessionKey, Remembered] = OrderedDict()
        self.open: dict[str, _Open] = {}  # approval id → waiting request
        self.recovered = asyncio.Event()

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event] | Reaction:
        await self.recovered.wait()
        match event:
            case ToolRequested():
                return await self._request(event)
            case ApprovalGranted() | ApprovalDenied():
                return await self._answer(event)
            case RunCompleted() | RunFailed() | RunCancelled():
                return await self._run_ended(event)
            case BudgetExceeded():
                return await self._over_budget(event)
        return []

    async def _over_budget(self, event: BudgetExceeded) -> Sequence[Event]:
        """A run stopped by a cap that asks: ask a person (``budget_approval.py``), once."""
        if event.on_exceed != "ask" or not event.run_id:
            return []
        state = await self.loader.state(event.run_id)
        approval_id = derive_event_id("approval", event.id, 0)
        if state.terminal or approval_id in state.approvals:
            return []  # the run is over, or asked already (a redelivery)
        expires_at = utcnow() + self.approval_ttl
        return [
            budget_approval.budget_request(
                event, expires_at=expires_at, may_ask=bool(self.approvers)
            )
        ]

    # -- requests ---------------------------------------------------------------------------

    async def _request(self, event: ToolRequested) -> Sequence[Event]:
        assert event.run_id
        state = await self.loader.state(event.run_id)
        if state.task is None:
            return [_deny(event.call_id, event.tool, "the run has no task")]
        call = state.call(event.call_id)
        if call is None or call.requested is None or call.requested.id != event.id:
            # not the model's call as the run's fold believes it (a forged or repeated request,
            # kept in ``state.rejected``): reported, never decided on
            await report_rejected(self.log, self.name, event, state)
            return []
        if call.grant or call.denied or call.approval:
            return []  # decided already: a redelivery
        if state.terminal:
            return [_deny(event.call_id, event.tool, f"the run is {state.status}")]
        workspace = workspace_of(state.task, self.default_workspace)
        rules = self.policy
        if self.config is not None:
            pin = state.started.config if state.started is not None else None
            rules = (await self.config.ensure(pin)).policy if pin else self.config.get(pin).policy
        try:
            touched = self.resources_of(event.tool, event.arguments) if self.resources_of else None
        except ValueError as exc:
            return [_deny(event.call_id, event.tool, str(exc))]
        decision = evaluate(
            rules,
            Request(
                tool=event.tool,
                arguments=event.arguments,
                workspace=workspace,
                known_tools=self.known_tools,
                protected=self.protected,
                tool_hosts=self.tool_hosts,
                resources=touched,
            ),
            budget=state.task.capabilities,
        )
        # asked each time: a call the guardrails flagged; code given a writable workspace (the
        # WASM sandbox mounts all of it writable, .git/config and hooks included: a session's
        # approval of one harmless script would let the next plant what the user's git runs)
        once_only = bool(event.guardrail)
        if decision.tier != "deny" and event.tool == CAPABILITY_TOOL:
            decision, writes = await self._capability_tier(event, decision)
            once_only = once_only or writes  # as ``python`` with ``write: true``, below
        if decision.tier != "deny" and event.tool == "python" and event.arguments.get("write"):
            # a writable workspace is a write, whatever the rule for sandboxed reads said; the
            # binding hash keeps ``write: true`` from being added after the approval
            decision = _raised(decision, "guarded", "the code asks for a writable workspace")
            once_only = True
        if decision.tier != "deny" and event.guardrail:
            # the guardrails asked a person (handlers/guardrails.py): never a session's approval
            decision = _raised(decision, "guarded", f"guardrail: {event.guardrail}")
        if decision.tier == "deny":
            return [_deny(event.call_id, event.tool, decision.reason, rule=decision.rule)]
        # the run's agent as started: a routed run's is the router's choice (route.decided)
        agent = state.started.agent if state.started is not None else state.task.agent
        allowed = enabled_tools(agent, state.task.tools, state.config)  # its version's
        if event.tool not in allowed:
            reason = (
                f"tool {event.tool!r} is not enabled for this run (enabled: {', '.join(allowed)})"
            )
            return [_deny(event.call_id, event.tool, reason, rule="profile")]
        if decision.tier == "safe":
            return [self._grant(state, event, decision)]
        if decision.tier == "guarded" and not event.guardrail:
            step = plan_approval.step_of(state, call)
            if step is not None and plan_approval.covers(
                step, event.tool, list(decision.capabilities), workspace
            ):
                return self._in_step(state, event, decision, step)
        if decision.tier == "guarded" and not once_only and self._may_share(state, decision):
            remembered = self.sessions.get(self._session_key(state, decision, event.tool))
            if remembered is not None and await self._same_workspace(state, remembered[1]):
                approval, _ = remembered
                return [self._grant(state, event, decision, approval_id=approval, remembered=True)]
        if not self.approvers:
            reason = (
                f"{decision.tier} call needs an approval and no approver is configured "
                "(policy.yaml: approval.approvers or approval.trust_local_approver)"
            )
            return [
                _deny(event.call_id, event.tool, reason, rule=decision.rule, tier=decision.tier)
            ]
        nonce = secrets.token_hex(16)
        resources = [c.resource for c in decision.capabilities]
        return [
            ApprovalRequested(
                # from the request, not the model's call id: unique to this run's call
                approval_id=derive_event_id("approval", event.id, 0),
                call_id=event.call_id,
                tool=event.tool,
                arguments=dict(event.arguments),
                tier=decision.tier,
                reason=decision.reason,
                rule=decision.rule,
                capabilities=list(decision.capabilities),
                binding_hash=binding_hash(event.tool, event.arguments, resources, nonce),
                nonce=nonce,
                expires_at=utcnow() + self.approval_ttl,
                options=["once", "session"] if decision.tier == "guarded" and not once_only
                else ["once"],
                run_id=state.run_id,
            )
        ]

    def _in_step(
        self, state: RunState, event: ToolRequested, decision: Decision, step: PlanStepStarted
    ) -> list[Event]:
        """A Guarded call that its plan step declared: the step's approval decides (asked
        now if it was not yet; the call waits for the answer, which decides it)."""
        request = plan_approval.request_of(state, step)
        if request is None:
            if not self.approvers:
                reason = (
                    "the plan step needs an approval and no approver is configured "
                    "(policy.yaml: approval.approvers or approval.trust_local_approver)"
                )
                return [_deny(event.call_id, event.tool, reason, rule=decision.rule,
                              tier=decision.tier)]  # fmt: skip
            expires_at = utcnow() + self.approval_ttl
            return [plan_approval.step_request(state, step, rule=decision.rule,
                                               expires_at=expires_at)]  # fmt: skip
        answer = self._first_trusted(state, request.approval_id)
        if answer is None:
            return []  # waiting: the answer to the step decides this call (``_answer``)
        if isinstance(answer, ApprovalGranted) and answer.time <= request.expires_at:
            return [self._grant(state, event, decision, approval_id=request.approval_id)]
        call = state.call(event.call_id)
        assert call is not None
        why = "it was denied" if isinstance(answer, ApprovalDenied) else "it expired"
        return [plan_approval.deny(call, request, why)]

    async def _capability_tier(
        self, event: ToolRequested, decision: Decision
    ) -> tuple[Decision, bool]:
        """The rules allow the tool; the capability's declared permissions may raise the tier
        (never lower it): writing → Guarded, network → Unsafe. The decision names the exact
        code it was made on (its pin, a resource of the grant and of any approval: the tool
        runs nothing else). Also whether the code gets a writable workspace."""
        name = event.arguments.get("name")
        if name == "list":
            return decision, False
        found = (
            await self.capability_permissions(name)
            if isinstance(name, str) and self.capability_permissions is not None
            else None
        )
        if found is None:
            return dataclasses.replace(
                decision,
                tier="deny",
                reason=f"no enabled capability {name!r} (`nanocrab capabilities list`)",
            ), False
        why = f"capability {name!r} declares {', '.join(found.permissions) or 'nothing'}"
        raised = _raised(decision, tier_for(found.permissions), why)
        pinned = Capability(tool=CAPABILITY_TOOL, resource=found.resource, access="execute")
        raised = dataclasses.replace(raised, capabilities=(*raised.capabilities, pinned))
        return raised, "fs.write" in found.permissions

    def _grant(
        self,
        state: RunState,
        event: ToolRequested,
        decision: Decision,
        *,
        approval_id: str | None = None,
        remembered: bool = False,
    ) -> GrantIssued:
        # every grant, Safe included, is bound to the exact call it was decided on: the executor
        # recomputes the hash from the model's call and refuses any other arguments
        nonce = secrets.token_hex(16)
        resources = [c.resource for c in decision.capabilities]
        grant = GrantIssued(
            grant_id=derive_event_id("grant", event.call_id, 0),
            call_id=event.call_id,
            tool=event.tool,
            capabilities=list(decision.capabilities),
            scope=decision.scope,
            tier=decision.tier,
            rule=decision.rule,
            expires_at=utcnow() + self.grant_ttl,
            binding_hash=binding_hash(event.tool, event.arguments, resources, nonce),
            nonce=nonce,
            approval_id=approval_id,
            remembered=remembered,
        )
        return self._sign(state, grant)

    def _sign(self, state: RunState, grant: E) -> E:
        assert state.task is not None
        return sign(
            msgspec.structs.replace(
                grant,
                run_id=state.run_id,
                session_id=state.task.session_id,
                tenant=state.task.tenant,
            ),
            self.keypair,
        )

    def _session_key(self, state: RunState, decision: Decision, tool: str) -> SessionKey:
        """A subagent (allowed by its rule to share) looks up its parent's session. A
        capability's approval is for its code: the key names the pin, not the ``capability``
        tool (an approval of one capability covered every other, and every later version)."""
        task = state.task
        assert task is not None
        session = task.parent_session_id if task.parent_run_id else task.session_id
        return (task.tenant, session or "", decision.rule or "",
                session_tool(tool, [c.resource for c in decision.capabilities]))  # fmt: skip

    async def _same_workspace(self, state: RunState, approved_in: str) -> bool:
        """Whether the run ``approved_in`` (where a session approval was given) worked in this
        run's workspace: a rule's ``${workspace}`` is each task's own, and a session spans
        tasks (the CLI keeps one per data directory, whatever the directory it runs in), so
        "writes in the workspace, for the session" must not reach another one."""
        task = state.task
        assert task is not None
        if approved_in == state.run_id:
            return True
        origin = (await self.loader.state(approved_in)).task
        if origin is None:
            return False
        here = workspace_of(task, self.default_workspace)
        return workspace_of(origin, self.default_workspace) == here

    @staticmethod
    def _may_share(state: RunState, decision: Decision) -> bool:
        task = state.task
        assert task is not None
        if task.parent_run_id is not None:
            return decision.share_with_subagents and bool(task.parent_session_id)
        return bool(task.session_id)

    # -- answers ----------------------------------------------------------------------------

    async def _answer(self, event: ApprovalGranted | ApprovalDenied) -> Sequence[Event]:
        state = await self.loader.state(event.run_id) if event.run_id else None
        request = state.approvals.get(event.approval_id) if state is not None else None
        call_id = request.call_id if request is not None else None

        def rejected(reason: str) -> list[Event]:
            return [
                SecurityRejected(
                    rejected_id=event.id,
                    rejected_type=event.type,
                    reason=reason,
                    call_id=call_id,
                    approval_id=event.approval_id,
                    signer=event.signer or None,
                )
            ]

        problem = verify(event, self.approvers)
        if problem is not None:
            return rejected(problem)
        if state is None or request is None:
            return rejected(f"no approval.requested {event.approval_id} in run {event.run_id}")
        if event.binding_hash != request.binding_hash:
            return rejected(
                "the answer is bound to other arguments than the request "
                f"(hash {event.binding_hash[:12] or '-'}… ≠ {request.binding_hash[:12]}…)"
            )
        if budget_approval.asked(request):
            return self._budget_answer(state, request, event)
        if plan_approval.asked(request):
            return await self._step_answer(state, request, event)
        call = state.call(request.call_id)
        if call is None or call.grant or call.denied:
            return []  # answered already: the first trusted answer won
        first = self._first_trusted(state, event.approval_id)
        if first is not None and first.id != event.id:
            return []  # another trusted answer (or the expiry) came first
        self.open.pop(event.approval_id, None)
        if state.terminal:
            return [_deny_call(request, f"the answer came after the run {state.status}")]
        if event.time > request.expires_at:
            return [
                ApprovalExpired(approval_id=request.approval_id, call_id=request.call_id),
                _deny_call(request, f"the approval expired at {request.expires_at:%H:%M:%S}"),
            ]
        if isinstance(event, ApprovalDenied):
            why = f": {event.reason}" if event.reason else ""
            return [_deny_call(request, f"denied by {event.approver}{why}")]
        return [self._approved(state, call, request, event)]

    def _budget_answer(
        self, state: RunState, request: ApprovalRequested, event: ApprovalGranted | ApprovalDenied
    ) -> list[Event]:
        """A verified answer to a budget approval: the first trusted one in time decides."""
        first = self._first_trusted(state, event.approval_id)
        if first is not None and first.id != event.id:
            return []  # another trusted answer (or the expiry) came first
        if budget_approval.settled(state, request, self._own):
            return []
        self.open.pop(event.approval_id, None)
        if state.terminal:
            return []
        if event.time > request.expires_at:
            why = f"the approval expired at {request.expires_at:%H:%M:%S}"
            return budget_approval.expired(request, why)
        return [
            self._sign(state, e) if isinstance(e, BudgetRaised) else e
            for e in budget_approval.answered(state, request, event)
        ]

    async def _step_answer(
        self, state: RunState, request: ApprovalRequested, event: ApprovalGranted | ApprovalDenied
    ) -> list[Event]:
        """A verified answer to a plan step's approval: the first trusted one decides every
        call of the step waiting for it."""
        first = self._first_trusted(state, event.approval_id)
        if first is not None and first.id != event.id:
            return []  # another trusted answer (or the expiry) came first
        self.open.pop(event.approval_id, None)
        if state.terminal:
            return []
        if event.time > request.expires_at:
            why = f"the approval expired at {request.expires_at:%H:%M:%S}"
            return plan_approval.expired(state, request, why)
        out: list[Event] = []
        for call in plan_approval.waiting(state, request):
            assert call.requested is not None
            out += await self._request(call.requested)
        return out

    def _first_trusted(self, state: RunState, approval_id: str) -> Event | None:
        for answer in state.answers.get(approval_id, []):
            if isinstance(answer, ApprovalExpired):
                return answer
            request = state.approvals[approval_id]
            if verify(answer, self.approvers) is None and answer.binding_hash == (
                request.binding_hash
            ):
                return answer
        return None

    def _approved(
        self, state: RunState, call: CallState, request: ApprovalRequested, answer: ApprovalGranted
    ) -> GrantIssued:
        session = (answer.remember == "session" and request.tier == "guarded"
                   and "session" in request.options)  # only when it was offered
        grant = GrantIssued(
            grant_id=derive_event_id("grant", request.call_id, 0),
            call_id=request.call_id,
            tool=request.tool,
            capabilities=list(request.capabilities),
            scope="step",
            tier=request.tier,
            rule=request.rule,
            expires_at=utcnow() + self.grant_ttl,
            binding_hash=request.binding_hash,
            nonce=request.nonce,
            approval_id=request.approval_id,
            remember="session" if session else "once",
        )
        if session and state.task is not None and state.task.session_id:
            tool = session_tool(request.tool, [c.resource for c in request.capabilities])
            key = (state.task.tenant, state.task.session_id, request.rule or "", tool)
            self._remember(key, (request.approval_id, state.run_id))
        return self._sign(state, grant)

    # -- run ends, expiry, recovery ----------------------------------------------------------

    async def _run_ended(self, event: Event) -> Sequence[Event]:
        assert event.run_id
        state = await self.loader.state(event.run_id)
        out: list[Event] = []
        for turn in state.turns:
            for call in turn.calls:
                if call.grant is not None and call.grant.grant_id not in state.revoked:
                    out.append(
                        GrantRevoked(
                            grant_id=call.grant.grant_id,
                            call_id=call.call_id,
                            reason=f"the run {state.status}",
                        )
                    )
                elif call.approval is not None and call.grant is None and call.denied is None:
                    self.open.pop(call.approval.approval_id, None)
                    out.append(
                        ApprovalExpired(approval_id=call.approval.approval_id, call_id=call.call_id)
                    )
                    out.append(_deny_call(call.approval, f"the run {state.status}"))
        for request in state.approvals.values():
            if (
                budget_approval.asked(request)
                and not budget_approval.settled(state, request, self._own)
                and not state.answers.get(request.approval_id)
            ):
                self.open.pop(request.approval_id, None)
                out.append(ApprovalExpired(approval_id=request.approval_id))
        self.loader.forget(event.run_id)
        return out

    def note(self, event: Event) -> None:
        """Remember what a handled reaction means for later decisions (called for every event
        the recovery replay or the runtime shows us)."""
        match event:
            case ApprovalRequested() if event.source == "policy":
                self.open.setdefault(event.approval_id, _Open(event, event))
            case GrantIssued() | GrantDenied() | BudgetRaised() | BudgetRefused() if (
                event.approval_id
            ):
                self.open.pop(event.approval_id, None)
            case ApprovalExpired():
                self.open.pop(event.approval_id, None)
        if (
            isinstance(event, GrantIssued)
            and event.remember == "session"
            and event.session_id
            and verify(event, {self.keypair.public_key.decode()}) is None
        ):
            key = (event.tenant, event.session_id, event.rule or "",
                   session_tool(event.tool, [c.resource for c in event.capabilities]))  # fmt: skip
            self._remember(key, (event.approval_id or "", event.run_id or ""))

    def _remember(self, key: SessionKey, remembered: Remembered) -> None:
        """Note a "for the session" approval, keeping the ``SESSION_CAPACITY`` most recent: a
        session older than those is asked again (stricter, never looser)."""
        self.sessions[key] = remembered
        self.sessions.move_to_end(key)
        while len(self.sessions) > SESSION_CAPACITY:
            self.sessions.popitem(last=False)

    async def background(self) -> None:
        """Replay this handler's decisions (``approval.*``, ``grant.*``) from the log, then
        follow the log from where the replay ended, expiring unanswered approvals meanwhile.

        Memory comes from the log alone, so nothing decided while this loop was down (crashed,
        restarted by the host, or the process stopped) is missed. Until the replay is done,
        ``handle`` waits. A failing follower ends the loop with its error (the host's supervisor
        restarts it, replaying again: :meth:`note` is idempotent)."""
        self.recovered.clear()  # after a crash: decide again only on memory replayed anew
        patterns = ("approval", "grant")
        ready = [asyncio.Event() for _ in patterns]
        async with asyncio.TaskGroup() as group:
            for pattern, done in zip(patterns, ready, strict=True):
                group.create_task(self._follow(self.log.subjects.of_type(pattern), done))
            for done in ready:
                await done.wait()
            self.recovered.set()
            while True:
                await asyncio.sleep(self.watch_interval_s)
                await self._expire_due()

    async def _follow(self, subject_filter: str, caught_up: asyncio.Event) -> None:
        """Note every stored event matching ``subject_filter``: the history up to the end of the
        log (then ``caught_up`` is set), and then each new one as it is stored."""
        last = 0
        async for stored in read(self.log, subject_filter):
            last = stored.seq
            if stored.event is not None:
                self.note(stored.event)
        caught_up.set()
        async for stored in read(self.log, subject_filter, Window(start_seq=last + 1), follow=True):
            if stored.event is not None:
                self.note(stored.event)

    async def _expire_due(self, now: datetime | None = None) -> None:
        now = now or utcnow()
        for approval_id, item in list(self.open.items()):
            if item.request.expires_at > now or not item.request.run_id:
                continue
            state = await self.loader.state(item.request.run_id)
            about_budget = budget_approval.asked(item.request)
            about_step = plan_approval.asked(item.request)
            call = state.call(item.request.call_id)
            if about_step and (state.terminal or not plan_approval.waiting(state, item.request)):
                continue  # nothing waits now; a call of the step asking later is answered
            if not about_step and (
                (budget_approval.settled(state, item.request, self._own) or state.terminal)
                if about_budget
                else (call is None or call.grant or call.denied)
            ):
                self.open.pop(approval_id, None)
                continue
            if self._first_trusted(state, approval_id) is not None:
                continue  # a real answer is in the log; its handling settles the call
            why = "nobody answered the approval in time"
            reaction = Reaction(
                plan_approval.expired(state, item.request, why)
                if about_step
                else budget_approval.expired(item.request, why)
                if about_budget
                else [
                    ApprovalExpired(approval_id=approval_id, call_id=item.request.call_id),
                    _deny_call(item.request, why),
                ],
                expect=Expect(state.seq, self.loader.scope(item.request.run_id)),
            )
            try:
                stored = await append_reaction(
                    self.log, self.name, item.cause, reaction, first=_EXPIRY_ORDINAL
                )
            except BusError as exc:
                logger.warning("could not expire approval %s: %r", approval_id, exc)
                continue
            if stored:
                self.open.pop(approval_id, None)
