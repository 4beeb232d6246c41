"""What the gateway does on the bus and in the read models, apart from HTTP.

Writes go out on two connections: ``gateway`` (tasks, messages, cancels, branches — the
broker refuses it anything else) and ``approver`` (answers, signed with the approver key, only
ever on behalf of a token holding the ``approve`` scope; the HTTP layer checks the scope).
Reads of one run come straight from the log, scoped to the token's tenant by subject, so they
are never stale; lists (runs, approvals, audit, capabilities) come from the projections
``nanocrab up`` keeps current.

Every check that can refuse a request (unknown run, another tenant's run, a finished run, an
answered approval) runs before anything is appended: a refused request leaves no event.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import msgspec
import nkeys
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.branching import BranchError, RunTree, find_in_run, run_tree
from nanocrab.bus import Appended, EventLog, Stored, append_traced, read
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.events import (
    RUN_ENDS,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    ImageBlock,
    LlmResponded,
    MessageQueued,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    SessionBranched,
    TaskSubmitted,
    ToolCompleted,
    new_event_id,
    utcnow,
)
from nanocrab.gateway.errors import Problem, conflict, not_found
from nanocrab.gateway.tokens import Token, TokenStore
from nanocrab.projections import (
    ApprovalRow,
    AuditRow,
    CapabilityRow,
    ViolationRow,
    approval_row,
    audit_rows,
    list_capabilities,
    pending_approvals,
    run_timeline,
    summarize,
    violations,
)
from nanocrab.security import sign
from nanocrab.tools.images import ImageTooLarge, NotAnImage, store_image

TERMINAL = RUN_ENDS
RunStatus = Literal[
    "queued", "running", "awaiting_approval", "completed", "failed", "cancelled"
]


@dataclass(frozen=True, slots=True)
class Submitted:
    """The answer to ``POST /v1/tasks``: ``replayed`` when an ``Idempotency-Key`` had already
    been used with the same body (nothing new was appended)."""

    run_id: str
    session_id: str
    event_id: str
    seq: int | None
    replayed: bool


@dataclass(frozen=True, slots=True)
class RunView:
    """One run folded from its events: what ``GET /v1/runs/{id}`` returns."""

    run_id: str
    tenant: str
    status: RunStatus
    text: str
    agent: str
    session_id: str | None
    submitted_at: datetime
    reply: str | None
    error: str | None
    usage: dict[str, float]
    pending_approvals: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    last_seq: int
    trace: str | None = field(default=None, repr=False)


def body_hash(payload: object) -> str:
    return hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()


def fold_run(run_id: str, events: list[Stored]) -> RunView:
    """The state, usage, open approvals and timeline of a run's events (log order)."""
    task: TaskSubmitted | None = None
    status: RunStatus = "queued"
    reply = error = None
    usage = {"turns": 0.0, "input_tokens": 0.0, "output_tokens": 0.0, "cache_read_tokens": 0.0,
             "cache_write_tokens": 0.0, "cost_usd": 0.0, "model_ms": 0.0, "tool_calls": 0.0,
             "tool_ms": 0.0}  # fmt: skip
    open_: dict[str, ApprovalRequested] = {}
    timeline: list[dict[str, Any]] = []
    for s in events:
        e = s.event
        if e is None:
            timeline.append(
                {"seq": s.seq, "type": "bus.rejected", "time": None, "source": None,
                 "step_id": None, "summary": "", "error": str(s.error)}
            )  # fmt: skip
            continue
        timeline.append(
            {"seq": s.seq, "id": e.id, "type": e.type, "time": e.time.isoformat(),
             "source": e.source, "step_id": e.step_id, "summary": summarize(e)}
        )  # fmt: skip
        match e:
            case TaskSubmitted() if task is None:
                task = e
            case RunStarted() if status == "queued":
                status = "running"
            case LlmResponded(usage=u):
                usage["turns"] += 1
                usage["input_tokens"] += u.input_tokens
                usage["output_tokens"] += u.output_tokens
                usage["cache_read_tokens"] += u.cache_read_tokens
                usage["cache_write_tokens"] += u.cache_write_tokens
                usage["cost_usd"] += e.cost_usd
                usage["model_ms"] += e.latency_ms
            case ToolCompleted():
                usage["tool_calls"] += 1
                usage["tool_ms"] += e.duration_ms
            case ApprovalRequested():
                open_[e.approval_id] = e
            case ApprovalGranted() | ApprovalDenied() | ApprovalExpired():
                open_.pop(e.approval_id, None)
            case RunCompleted():
                status, reply = "completed", e.reply
            case RunFailed():
                status, error = "failed", f"{e.kind}: {e.reason}"
            case RunCancelled():
                status, error = "cancelled", e.reason
            case _:
                pass
    if task is None:
        raise not_found("run", run_id)
    if status == "running" and open_:
        status = "awaiting_approval"
    return RunView(
        run_id=run_id,
        tenant=task.tenant,
        status=status,
        text=task.text,
        agent=task.agent,
        session_id=task.session_id,
        submitted_at=task.time,
        reply=reply,
        error=error,
        usage=usage,
        pending_approvals=[approval_json(a) for a in open_.values()],
        timeline=timeline,
        last_seq=events[-1].seq if events else 0,
        trace=task.trace,
    )


def approval_json(a: ApprovalRequested) -> dict[str, Any]:
    return {
        "approval_id": a.approval_id, "run_id": a.run_id, "call_id": a.call_id, "tool": a.tool,
        "arguments": a.arguments, "tier": a.tier, "rule": a.rule, "reason": a.reason,
        "options": list(a.options), "expires_at": a.expires_at.isoformat(),
    }  # fmt: skip


@dataclass
class Backend:
    """The gateway's bus and database side. ``log`` publishes as ``gateway``; ``approver``
    as ``approver``; ``approver_key`` signs answers; ``engine`` reads the projections."""

    log: EventLog
    approver: EventLog
    approver_key: nkeys.KeyPair
    engine: AsyncEngine
    tokens: TokenStore

    async def run_events(self, tenant: str, run_id: str) -> list[Stored]:
        """Every event of ``run_id`` stored under ``tenant`` (empty: no such run for it)."""
        subject = self.log.subjects.run(run_id, tenant=tenant)
        return [s async for s in read(self.log, subject)]

    async def run(self, tenant: str, run_id: str) -> RunView:
        return fold_run(run_id, await self.run_events(tenant, run_id))

    async def live(self, tenant: str, run_id: str) -> RunView:
        view = await self.run(tenant, run_id)
        if view.status in ("completed", "failed", "cancelled"):
            raise conflict(f"run {run_id} is already {view.status}")
        return view

    async def submit(
        self,
        token: Token,
        *,
        text: str,
        agent: str,
        session_id: str | None,
        idempotency_key: str | None,
        request_hash: str,
        images: Sequence[tuple[str, bytes]] = (),
    ) -> Submitted:
        """Publish a ``task.submitted`` for ``token``'s tenant. With an idempotency key the run
        id is remembered: the same key and body answer with the first run (appending again,
        which JetStream de-duplicates, only if the first attempt never got stored); the same key
        with another body is a 422. ``images`` (name, bytes) are fitted and stored in the object
        store first (content-addressed: a retry stores nothing new); one that is not an image,
        or cannot be fitted, is a 422."""
        blocks = [await self._image(name, data) for name, data in images]
        run_id = new_event_id()
        session = session_id or new_event_id()
        if idempotency_key is not None:
            known = self.tokens.remember(
                token.tenant, idempotency_key, run_id=run_id, event_id=run_id,
                body_hash=request_hash,
            )  # fmt: skip
            if known.event_id != run_id:
                if known.body_hash != request_hash:
                    raise Problem(
                        422, "idempotency-key-reused", "Idempotency-Key reused with another body",
                        f"Idempotency-Key {idempotency_key!r} was first used with a different "
                        f"request (run {known.run_id}); use a new key for a new task",
                    )  # fmt: skip
                if known.published:
                    return Submitted(known.run_id, "", known.event_id, None, replayed=True)
                run_id = known.run_id
        event = TaskSubmitted(
            id=run_id, text=text, agent=agent, run_id=run_id, task_id=run_id,
            session_id=session, tenant=token.tenant, source="gateway", images=blocks,
        )  # fmt: skip
        appended: Appended = await append_traced(self.log, event)
        if idempotency_key is not None:
            self.tokens.published(token.tenant, idempotency_key)
        return Submitted(run_id, session, event.id, appended.seq, replayed=appended.duplicate)

    async def _image(self, name: str, data: bytes) -> ImageBlock:
        try:
            return await store_image(JetStreamArtifacts(self.log), name, data)
        except (NotAnImage, ImageTooLarge) as exc:
            raise Problem(422, "bad-image", "An image cannot be used", str(exc)) from exc

    async def message(
        self, token: Token, run_id: str, text: str, mode: Literal["steer", "follow_up"]
    ) -> Appended:
        view = await self.live(token.tenant, run_id)
        event = MessageQueued(
            mode=mode, text=text, run_id=run_id, task_id=run_id, session_id=view.session_id,
            tenant=token.tenant, source="gateway",
        )  # fmt: skip
        return await append_traced(self.log, event, parent=view.trace)

    async def branch(self, token: Token, run_id: str, at: str) -> tuple[SessionBranched, Appended]:
        """A new session forked from event ``at`` of ``token``'s tenant's run ``run_id``
        (``nanocrab/branching.py``): 404 for an unknown run or event, 422 for an ambiguous id.
        The run may be live or finished; nothing of it changes."""
        events = await self.run_events(token.tenant, run_id)
        if not events:
            raise not_found("run", run_id)
        try:
            point = find_in_run(run_id, events, at)
        except BranchError as exc:
            raise Problem(422, "ambiguous-event", "The event id is ambiguous", str(exc)) from None
        if point is None:
            raise Problem(
                404, "not-found", "No such event",
                f"run {run_id} has no event {at!r} (its events: GET /v1/runs/{run_id})",
            )  # fmt: skip
        branched = point.branch(by=token.name, source="gateway")
        task = next((s.event for s in events if isinstance(s.event, TaskSubmitted)), None)
        appended = await append_traced(self.log, branched, parent=task.trace if task else None)
        return branched, appended

    async def tree(self, tenant: str, run_id: str) -> RunTree:
        """The forks that led to the run's session and the branches forked from the run."""
        view = await self.run(tenant, run_id)
        return await run_tree(self.log, run_id, view.session_id, tenant=tenant)

    async def cancel(self, token: Token, run_id: str, reason: str) -> Appended:
        view = await self.live(token.tenant, run_id)
        event = RunCancelled(
            reason=reason, by=token.name, run_id=run_id, task_id=run_id,
            session_id=view.session_id, tenant=token.tenant, source="gateway",
        )  # fmt: skip
        return await append_traced(self.log, event, parent=view.trace)

    async def answer(
        self,
        token: Token,
        approval_id: str,
        *,
        grant: bool,
        remember: Literal["once", "session"] = "once",
        reason: str = "",
        via: str = "gateway",
        run_id: str | None = None,
    ) -> ApprovalGranted | ApprovalDenied:
        """Answer a pending approval of ``token``'s tenant, signed with the approver key and
        naming the token's holder. 404 for an unknown id (or another tenant's), 409 when it is
        answered, expired or its run is over, 422 for ``session`` where only ``once`` is
        offered. ``via`` names the front end in the recorded approver (``alice (gateway)``).

        ``run_id``, when the caller knows it (a live page, a chat following the run), finds the
        request in the run's log at once; without it the audit projection says which run asked
        (by the exact id: no prefixes over the network), which may lag the log by a moment."""
        if run_id is None:
            row = await approval_row(self.engine, approval_id, prefix=False)
            if row is None or row.run_id is None:
                raise not_found("approval", approval_id)
            run_id, approval_id = row.run_id, row.approval_id
        events = await self.run_events(token.tenant, run_id)
        request = next(
            (s.event for s in events if isinstance(s.event, ApprovalRequested)
             and s.event.approval_id == approval_id),
            None,
        )  # fmt: skip
        if request is None:
            raise not_found("approval", approval_id)
        view = fold_run(run_id, events)
        if all(a["approval_id"] != request.approval_id for a in view.pending_approvals):
            raise conflict(f"approval {request.approval_id} is already answered or expired")
        if view.status not in ("running", "awaiting_approval"):
            raise conflict(f"run {run_id} is already {view.status}")
        if request.expires_at <= utcnow():
            raise conflict(f"approval {request.approval_id} has expired")
        if remember not in request.options:
            raise Problem(
                422, "option-not-offered", "This approval does not offer that option",
                f"remember={remember!r}: offered {', '.join(request.options)}",
            )  # fmt: skip
        common: dict[str, Any] = {
            "approval_id": request.approval_id, "approver": f"{token.name} ({via})",
            "binding_hash": request.binding_hash, "run_id": request.run_id,
            "session_id": request.session_id, "task_id": request.task_id,
            "tenant": request.tenant, "source": "gateway",
        }  # fmt: skip
        answer: ApprovalGranted | ApprovalDenied = (
            ApprovalGranted(remember=remember, **common)
            if grant
            else ApprovalDenied(reason=reason, **common)
        )
        signed = sign(answer, self.approver_key)
        await append_traced(self.approver, signed, parent=request.trace)
        return signed

    async def tenant_runs(self, tenant: str, run_ids: set[str]) -> set[str]:
        """Those of ``run_ids`` submitted under ``tenant`` (the audit tables carry no tenant)."""
        if not run_ids:
            return set()
        t = run_timeline
        query = (
            select(t.c.run_id)
            .where(t.c.tenant == tenant, t.c.type == "task.submitted")
            .where(t.c.run_id.in_(sorted(run_ids)))
        )
        async with self.engine.connect() as conn:
            return set((await conn.execute(query)).scalars().all())

    async def approvals(self, tenant: str) -> list[ApprovalRow]:
        rows = await pending_approvals(self.engine)
        mine = await self.tenant_runs(tenant, {r.run_id for r in rows if r.run_id})
        return [r for r in rows if r.run_id in mine]

    async def audit(
        self,
        tenant: str,
        *,
        run_id: str | None,
        call_id: str | None,
        tool: str | None,
        status: str | None,
        since: datetime | None,
        limit: int,
    ) -> list[AuditRow]:
        rows = await audit_rows(
            self.engine, run_id=run_id, call_id=call_id, tool=tool, status=status, since=since,
            limit=limit,
        )  # fmt: skip
        mine = await self.tenant_runs(tenant, {r.run_id for r in rows if r.run_id})
        return [r for r in rows if r.run_id in mine]

    async def violations(
        self, tenant: str, *, run_id: str | None, since: datetime | None
    ) -> list[ViolationRow]:
        rows = await violations(self.engine, run_id=run_id, since=since)
        mine = await self.tenant_runs(tenant, {r.run_id for r in rows if r.run_id})
        return [r for r in rows if r.run_id in mine]

    async def runs(self, tenant: str, limit: int = 50) -> list[dict[str, Any]]:
        """The tenant's newest runs from the timeline projection: id, task, status, times."""
        t = run_timeline
        submitted = (
            select(t.c.run_id, t.c.time, t.c.summary, t.c.seq)
            .where(t.c.tenant == tenant, t.c.type == "task.submitted")
            .order_by(t.c.seq.desc())
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(submitted)).mappings().all()
            ids = [r["run_id"] for r in rows]
            ends = (
                await conn.execute(
                    select(t.c.run_id, t.c.type, func.max(t.c.seq))
                    .where(t.c.run_id.in_(ids))
                    .where(t.c.type.in_([*TERMINAL, "run.started", "approval.requested"]))
                    .group_by(t.c.run_id, t.c.type)
                )
            ).all()
        seen: dict[str, set[str]] = {}
        for run, kind, _ in ends:
            seen.setdefault(run, set()).add(kind)
        out = []
        for r in rows:
            kinds = seen.get(r["run_id"], set())
            end = next((k.split(".")[1] for k in TERMINAL if k in kinds), None)
            status = end or ("running" if "run.started" in kinds else "queued")
            out.append(
                {"run_id": r["run_id"], "submitted_at": r["time"].isoformat(),
                 "task": r["summary"], "status": status, "seq": r["seq"]}
            )  # fmt: skip
        return out

    async def capabilities(self) -> list[CapabilityRow]:
        return await list_capabilities(self.engine)

