"""Budgets set to ``on_exceed: ask`` on the real agent loop: a run over its cap waits while the
policy handler asks a person through the approval flow; approved, it goes on with the cap one
increment higher (``budget.raised``, signed by the policy), and asks again when that is spent;
denied or expired, it ends with ``budget.refused`` + ``run.failed{kind: budget}``. The audit,
the approvals list and the timeline record each step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import EventLog, read
from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    Budget,
    BudgetExceeded,
    BudgetRaised,
    BudgetRefused,
    Event,
    LlmRequested,
    RunCompleted,
    RunFailed,
    TaskSubmitted,
)
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.llm import ScriptedProvider
from nanocrab.policy import Policy
from nanocrab.policy.budgets import Budgets, Limit
from nanocrab.projections.audit import approval_row, budget_stops
from nanocrab.projections.audit.tables import audit_invocations
from nanocrab.projections.timeline import run_timeline_rows
from nanocrab.security import KeyRing, sign, signed_by, verify

from .agent_fixtures import OPEN_POLICY, agent_reactors, finished, of_type, running_host, submit
from .conftest import eventually
from .test_budget_run import LOOPING

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return demo.make_workspace(tmp_path / "ws")


@pytest.fixture
def keys(tmp_path: Path) -> KeyRing:
    return KeyRing(tmp_path / "keys")


def loop(
    log: EventLog, engine: AsyncEngine, workspace: Path, keys: KeyRing, run: Limit,
    rules: Policy = OPEN_POLICY,
) -> list[Any]:  # fmt: skip
    """The agent loop with ``run`` as the run cap; the orchestrator believes only raises signed
    by the policy key."""
    provider = ScriptedProvider.from_text(LOOPING)
    rest = agent_reactors(log, engine, provider, workspace, orchestrators=(), keys=keys,
                          rules=rules)  # fmt: skip
    orchestrator = Orchestrator(log, trust=signed_by({keys.public_key("policy")}),
                                budgets=Budgets(run=run))  # fmt: skip
    return [orchestrator, *rest]


async def next_request(log: EventLog, run_id: str, after: int = 0) -> ApprovalRequested:
    """The run's ``after``-th budget approval request (0: the first), as it arrives."""

    async def wait() -> ApprovalRequested:
        seen = 0
        async for s in read(log, log.subjects.run(run_id), follow=True):
            if isinstance(s.event, ApprovalRequested) and s.event.about == "budget":
                if seen == after:
                    return s.event
                seen += 1
        raise AssertionError("the log ended")

    return await asyncio.wait_for(wait(), 30)


async def answer(
    log: EventLog, keys: KeyRing, task: TaskSubmitted, request: ApprovalRequested, *, grant: bool
) -> None:
    env: dict[str, Any] = {"run_id": task.run_id, "session_id": task.session_id,
                           "task_id": task.task_id, "tenant": task.tenant, "source": "approver"}  # fmt: skip
    common = {"approval_id": request.approval_id, "approver": "ann",
              "binding_hash": request.binding_hash}  # fmt: skip
    reply: ApprovalGranted | ApprovalDenied = (
        ApprovalGranted(**common, **env)
        if grant
        else ApprovalDenied(**common, reason="that is enough", **env)
    )
    await log.append(sign(reply, keys.keypair("approver")))


async def test_an_approved_raise_lets_the_run_go_on_and_is_audited(
    log: EventLog, engine: AsyncEngine, workspace: Path, keys: KeyRing
) -> None:
    cap = Limit(max_tokens=1, on_exceed="ask", raise_tokens=10_000_000)
    async with running_host(log, engine, loop(log, engine, workspace, keys, cap)):
        task = submit("look around", workspace)
        await log.append(task)
        run_id = task.run_id or ""
        request = await next_request(log, run_id)
        await answer(log, keys, task, request, grant=True)
        events = await finished(log, run_id)

        (over,) = of_type(events, BudgetExceeded)
        assert (over.scope, over.limit, over.on_exceed, over.turn) == ("run", "tokens", "ask", 1)
        assert over.increment == Budget(max_tokens=10_000_000)
        assert request.call_id == over.id and request.tool == "budget"
        assert request.arguments["raise_tokens"] == 10_000_000 and request.options == ["once"]
        assert "run budget" in request.reason
        (raised,) = of_type(events, BudgetRaised)
        assert raised.exceeded_id == over.id and raised.approval_id == request.approval_id
        assert raised.increment == Budget(max_tokens=10_000_000) and raised.approver == "ann"
        assert verify(raised, {keys.public_key("policy")}) is None, "signed by the policy"
        assert of_type(events, RunCompleted), "the run went on to its answer"
        assert len(of_type(events, LlmRequested)) == 4
        assert not of_type(events, BudgetRefused) and not of_type(events, RunFailed)

        async def audited() -> list[Any] | None:
            rows = await budget_stops(engine, run_id=run_id)
            return rows if rows and rows[0].status == "raised" else None

        (row,) = await eventually(audited)
        assert (row.on_exceed, row.approver, row.raise_tokens) == ("ask", "ann", 10_000_000)
        assert row.approval_id == request.approval_id and row.answered_at is not None
        approval = await approval_row(engine, request.approval_id)
        assert approval is not None and approval.status == "granted"
        assert approval.tool == "budget" and approval.approver == "ann"
        async with engine.connect() as conn:
            calls = (await conn.execute(
                audit_invocations.select().where(audit_invocations.c.call_id == over.id)
            )).all()  # fmt: skip
        assert not calls, "a budget approval is not a tool call"

        async def in_timeline() -> bool:
            rows = await run_timeline_rows(engine, run_id)
            types = [r.type for r in rows]
            return "budget.raised" in types and "approval.requested" in types

        await eventually(in_timeline)
        summaries = {r.type: r.summary for r in await run_timeline_rows(engine, run_id)}
        assert "asking for more" in summaries["budget.exceeded"]
        assert "approved by ann" in summaries["budget.raised"]


@pytest.mark.parametrize("how", ["denied", "expired", "no_approver"])
async def test_a_refused_or_unanswered_raise_ends_the_run(
    log: EventLog, engine: AsyncEngine, workspace: Path, keys: KeyRing, how: str
) -> None:
    approval: dict[str, Any] = {"timeout": 1.5}
    if how == "no_approver":
        approval["trust_local_approver"] = False  # and no approvers listed: nobody to ask
    rules = Policy.from_mapping({**OPEN_POLICY.model_dump(mode="json", exclude={"budgets"}),
                                 "approval": approval})  # fmt: skip
    cap = Limit(max_tokens=1, on_exceed="ask")
    async with running_host(log, engine, loop(log, engine, workspace, keys, cap, rules)):
        task = submit("look around", workspace)
        await log.append(task)
        run_id = task.run_id or ""
        request = await next_request(log, run_id) if how != "no_approver" else None
        if how == "denied" and request is not None:
            await answer(log, keys, task, request, grant=False)
        events = await finished(log, run_id)

    (over,) = of_type(events, BudgetExceeded)
    (refused,) = of_type(events, BudgetRefused)
    (failed,) = of_type(events, RunFailed)
    assert refused.exceeded_id == over.id and refused.answer == how
    assert failed.kind == "budget" and f"refused ({how}" in failed.reason
    assert len(of_type(events, LlmRequested)) == 1, "no model call after the stop"
    assert not of_type(events, BudgetRaised)
    approval_id = request.approval_id if request is not None else None
    if how == "expired":
        assert [e.approval_id for e in of_type(events, ApprovalExpired)] == [approval_id]
    elif how == "denied":
        assert "denied by ann: that is enough" in refused.reason
    else:
        assert not of_type(events, ApprovalRequested) and "no approver" in refused.reason

    async def audited() -> list[Any] | None:
        rows = await budget_stops(engine, run_id=run_id)
        return rows if rows and rows[0].status == "refused" else None

    (row,) = await eventually(audited)
    assert row.answer == how and row.approval_id == approval_id


async def test_each_approval_grants_one_increment_and_a_spent_one_asks_again(
    log: EventLog, engine: AsyncEngine, workspace: Path, keys: KeyRing
) -> None:
    """An increment of one token is less than the first call spent: the run, raised by one
    increment per approval, is still over and asks again before the same call. The third
    answer, a denial, ends it."""
    cap = Limit(max_tokens=1, on_exceed="ask", raise_tokens=1)
    async with running_host(log, engine, loop(log, engine, workspace, keys, cap)):
        task = submit("look around", workspace)
        await log.append(task)
        run_id = task.run_id or ""
        for i in range(2):
            await answer(log, keys, task, await next_request(log, run_id, i), grant=True)
        await answer(log, keys, task, await next_request(log, run_id, 2), grant=False)
        events = await finished(log, run_id)

    stops = of_type(events, BudgetExceeded)
    assert [s.turn for s in stops] == [1, 1, 1]
    assert [s.max_tokens for s in stops] == [1, 2, 3], "the cap as raised so far"
    assert [r.exceeded_id for r in of_type(events, BudgetRaised)] == [s.id for s in stops[:2]]
    assert len(of_type(events, LlmRequested)) == 1
    (failed,) = of_type(events, RunFailed)
    assert failed.kind == "budget" and "3 tokens" in failed.reason


async def test_a_raise_not_signed_by_the_policy_is_not_believed(
    log: EventLog, engine: AsyncEngine, workspace: Path, keys: KeyRing
) -> None:
    cap = Limit(max_tokens=1, on_exceed="ask")
    async with running_host(log, engine, loop(log, engine, workspace, keys, cap)):
        task = submit("look around", workspace)
        await log.append(task)
        run_id = task.run_id or ""
        request = await next_request(log, run_id)
        forged: Event = BudgetRaised(
            exceeded_id=request.call_id, approval_id=request.approval_id, scope="run",
            key=run_id, increment=Budget(max_tokens=10**9), approver="mallory", source="policy",
            run_id=run_id, session_id=task.session_id, task_id=task.task_id,
        )  # fmt: skip
        await log.append(forged)
        await answer(log, keys, task, request, grant=False)
        events = await finished(log, run_id)
    (failed,) = of_type(events, RunFailed)
    assert failed.kind == "budget" and len(of_type(events, LlmRequested)) == 1


def test_policy_files_take_the_mode_and_its_increment() -> None:
    from nanocrab.policy import PolicyError

    policy = Policy.from_mapping({"version": 1, "budgets": {
        "run": {"max_usd": 1.0, "on_exceed": "ask", "raise_usd": 0.5},
        "tenants": {"*": {"max_tokens": 9}},
    }})  # fmt: skip
    assert policy.budgets.run == Limit(max_usd=1.0, on_exceed="ask", raise_usd=0.5)
    assert policy.budgets.tenant("x") == Limit(max_tokens=9, on_exceed="fail")
    with pytest.raises(PolicyError):
        Policy.from_mapping({"version": 1, "budgets": {"run": {"max_usd": 1, "on_exceed": "beg"}}})


# -- the decision alone (no bus) ----------------------------------------------------------------


def _stopped(**limit: Any) -> tuple[Any, Budgets, BudgetExceeded]:
    from datetime import UTC, datetime

    from nanocrab.handlers.orchestrator import decide

    from .test_budget import after_one_call

    state = after_one_call(0.3, 1000)
    budgets = Budgets(run=Limit(max_tokens=1000, on_exceed="ask", **limit))
    (over,) = decide(state, datetime.now(UTC), budgets=budgets)
    assert isinstance(over, BudgetExceeded) and over.on_exceed == "ask"
    state.apply(msgspec.structs.replace(over, tenant="acme"), 50)  # stamped, as appended
    return state, budgets, over


def test_a_stop_that_asks_waits_and_no_later_cap_change_releases_it() -> None:
    from nanocrab.events import utcnow
    from nanocrab.handlers.orchestrator import decide

    state, budgets, over = _stopped()
    assert over.increment == Budget(max_tokens=1000) and over.max_tokens == 1000
    assert decide(state, utcnow(), budgets=budgets) == []
    assert decide(state, utcnow()) == [], "caps gone (a reload) do not release a stopped run"


def test_a_raise_lets_the_call_through_and_a_refusal_ends_the_run() -> None:
    from nanocrab.events import utcnow
    from nanocrab.handlers.orchestrator import decide

    state, budgets, over = _stopped(raise_tokens=500)
    raised = BudgetRaised(exceeded_id=over.id, approval_id="a", scope="run", key=state.run_id,
                          increment=Budget(max_tokens=500), tenant="acme")  # fmt: skip
    state.apply(raised, 51)
    (call,) = decide(state, utcnow(), budgets=budgets)
    assert isinstance(call, LlmRequested) and call.turn == 1

    state, budgets, over = _stopped()
    state.apply(BudgetRefused(exceeded_id=over.id, answer="denied", reason="no", tenant="acme"), 51)
    (failed,) = decide(state, utcnow(), budgets=budgets)
    assert isinstance(failed, RunFailed) and failed.kind == "budget"
    assert "refused (denied: no)" in failed.reason
