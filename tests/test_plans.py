"""Plan → Step → Action on the real agent loop (scripted model, real bus, policy and executor):
a planning agent plans first, works step by step with each step's declared tools only, a step
that declared what it touches is approved as a whole (one approval, a grant per call citing
it, an undeclared resource still asked about on its own), and a step whose call is denied fails
and the model plans again, a bounded number of times."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import agents
from nanocrab.bus import EventLog, read
from nanocrab.events import (
    ApprovalGranted,
    ApprovalRequested,
    GrantDenied,
    GrantIssued,
    LlmRequested,
    PlanCreated,
    PlanStepCompleted,
    PlanStepFailed,
    PlanStepStarted,
    RunCompleted,
    RunFailed,
    TaskSubmitted,
    ToolCompleted,
)
from nanocrab.llm import ScriptedProvider
from nanocrab.policy import Policy
from nanocrab.projections.audit import approval_row
from nanocrab.projections.timeline import run_timeline_rows
from nanocrab.security import KeyRing, sign

from .agent_fixtures import agent_reactors, finished, of_type, running_host, submit
from .conftest import eventually

pytestmark = pytest.mark.timeout(90)

RULES = Policy.from_mapping(
    {
        "version": 1,
        "rules": [
            {"id": "reads", "tools": ["read", "ls", "glob", "grep"], "paths": ["${workspace}"],
             "tier": "safe"},
            {"id": "writes", "tools": ["write", "edit"], "paths": ["${workspace}"],
             "tier": "guarded"},
            {"id": "plans", "tools": ["plan"], "tier": "safe"},
        ],
    },
    source="tests/test_plans.py",
)  # fmt: skip

THREE_STEPS = """
scripts:
  - name: plan
    turns:
      - tool_calls:
          - name: plan
            input:
              steps:
                - {intent: "read the notes", tools: [read], resources: ["notes.txt"]}
                - {intent: "write the summary", tools: [write], resources: ["out/*.md"]}
                - {intent: "report", tools: []}
      - tool_calls: [{name: read, input: {path: notes.txt}}]
      - text: "The notes say hello."
      - tool_calls:
          - {name: write, input: {path: out/summary.md, content: "hello"}}
          - {name: write, input: {path: out/extra.md, content: "more"}}
          - {name: write, input: {path: elsewhere.txt, content: "not declared"}}
      - text: "Summary written."
      - text: "Done: the summary is in out/summary.md."
"""

REPLANS = """
scripts:
  - name: replan
    turns:
      - tool_calls:
          - name: plan
            input: {steps: [{intent: "write outside", tools: [write], resources: ["/etc/x"]}]}
      - tool_calls: [{name: write, input: {path: /etc/x, content: "no"}}]
      - tool_calls:
          - name: plan
            input: {steps: [{intent: "again", tools: [write], resources: ["/etc/x"]}]}
      - tool_calls: [{name: write, input: {path: /etc/x, content: "no"}}]
      - tool_calls:
          - name: plan
            input: {steps: [{intent: "and again", tools: [write], resources: ["/etc/x"]}]}
      - tool_calls: [{name: write, input: {path: /etc/x, content: "no"}}]
"""


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)
    (ws / "notes.txt").write_text("hello\n")
    return ws


@pytest.fixture(autouse=True)
def planner(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = agents.AgentProfile(
        name="planner", description="plans first", system_prompt="Plan, then act.",
        tools=("read", "write", "ls", "plan"), planner=True,
    )  # fmt: skip
    monkeypatch.setitem(agents.PROFILES, "planner", profile)


async def approve(log: EventLog, keys: KeyRing, task: TaskSubmitted, r: ApprovalRequested) -> None:
    env: dict[str, Any] = {"run_id": task.run_id, "session_id": task.session_id,
                           "task_id": task.task_id, "tenant": task.tenant, "source": "approver"}  # fmt: skip
    granted = ApprovalGranted(approval_id=r.approval_id, approver="ann",
                              binding_hash=r.binding_hash, **env)  # fmt: skip
    await log.append(sign(granted, keys.keypair("approver")))


async def approvals(log: EventLog, run_id: str, n: int) -> list[ApprovalRequested]:
    """The run's first ``n`` approval requests, as they arrive."""

    async def wait() -> list[ApprovalRequested]:
        seen: list[ApprovalRequested] = []
        async for s in read(log, log.subjects.run(run_id), follow=True):
            if isinstance(s.event, ApprovalRequested):
                seen.append(s.event)
                if len(seen) == n:
                    return seen
        raise AssertionError("the log ended")

    return await asyncio.wait_for(wait(), 30)


async def test_a_plan_runs_step_by_step_and_a_declared_step_is_approved_once(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    keys = KeyRing(tmp_path / "keys")
    provider = ScriptedProvider.from_text(THREE_STEPS)
    reactors = agent_reactors(log, engine, provider, workspace, keys=keys, rules=RULES)
    async with running_host(log, engine, reactors):
        task = submit("summarise the notes", workspace, agent="planner")
        await log.append(task)
        run_id = task.run_id or ""
        (step_request,) = await approvals(log, run_id, 1)
        assert step_request.about == "plan_step" and step_request.tool == "plan_step"
        assert step_request.arguments["intent"] == "write the summary"
        assert step_request.arguments["resources"] == ["out/*.md"]
        await approve(log, keys, task, step_request)
        _, single = await approvals(log, run_id, 2)
        assert single.about == "tool_call" and single.arguments["path"] == "elsewhere.txt", (
            "a resource the step did not declare is asked about on its own"
        )
        await approve(log, keys, task, single)
        events = await finished(log, run_id)

    (plan,) = of_type(events, PlanCreated)
    assert [s.intent for s in plan.steps] == ["read the notes", "write the summary", "report"]
    assert [(s.index, s.step.tools) for s in of_type(events, PlanStepStarted)] == [
        (0, ["read"]), (1, ["write"]), (2, []),
    ]  # fmt: skip
    assert [s.index for s in of_type(events, PlanStepCompleted)] == [0, 1, 2]
    requests = of_type(events, LlmRequested)
    assert [r.tools for r in requests] == [["plan"], ["read"], ["read"], ["write"], ["write"], []]
    (done,) = of_type(events, RunCompleted)
    assert done.reply == "Done: the summary is in out/summary.md."
    assert (workspace / "out" / "summary.md").read_text() == "hello"
    assert (workspace / "out" / "extra.md").read_text() == "more"
    assert (workspace / "elsewhere.txt").read_text() == "not declared"

    grants = {g.call_id: g for g in of_type(events, GrantIssued)}
    writes = [c for c in of_type(events, ToolCompleted) if c.tool == "write"]
    step_grants = [g for g in grants.values() if g.approval_id == step_request.approval_id]
    assert len(step_grants) == 2, "the two declared writes are granted by the step's approval"
    assert all(g.tool == "write" and g.tier == "guarded" for g in step_grants)
    assert len({g.binding_hash for g in step_grants}) == 2, "each grant is bound to its own call"
    (own,) = [g for g in grants.values() if g.approval_id == single.approval_id]
    assert own.call_id == single.call_id
    assert len(writes) == 3 and not any(w.is_error for w in writes)

    row = await eventually(lambda: approval_row(engine, step_request.approval_id))
    assert row.tool == "plan_step"

    async def in_timeline() -> bool:
        types = [r.type for r in await run_timeline_rows(engine, run_id)]
        return "plan.created" in types and types.count("plan.step_started") == 3

    await eventually(in_timeline)


async def test_a_denied_step_fails_and_the_model_replans_until_the_replans_are_spent(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    keys = KeyRing(tmp_path / "keys")
    provider = ScriptedProvider.from_text(REPLANS)
    reactors = agent_reactors(log, engine, provider, workspace, keys=keys, rules=RULES)
    async with running_host(log, engine, reactors):
        task = submit("write outside", workspace, agent="planner")
        await log.append(task)
        events = await finished(log, task.run_id or "")

    plans = of_type(events, PlanCreated)
    assert [p.revision for p in plans] == [0, 1, 2]
    failures = of_type(events, PlanStepFailed)
    assert [f.replan for f in failures] == [True, True, False]
    assert all("write" in f.reason for f in failures)
    assert len(of_type(events, GrantDenied)) == 3
    (failed,) = of_type(events, RunFailed)
    assert failed.kind == "plan" and "no re-plan is left" in failed.reason
    assert [r.tools for r in of_type(events, LlmRequested)] == [
        ["plan"], ["write"], ["plan"], ["write"], ["plan"], ["write"],
    ]  # fmt: skip


def test_a_plan_decision_landing_one_event_at_a_time_is_completed_not_repeated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's end, the next step's start and its model call land one event at a time: a
    decision taken between them (a redelivery, another orchestrator instance) adds only what is
    missing, and a plan call already recorded is not recorded twice."""
    from nanocrab.events import (
        GrantIssued as Grant,
    )
    from nanocrab.events import (
        LlmResponded,
        RunStarted,
        TextBlock,
        ToolRequested,
        ToolUseBlock,
        utcnow,
    )
    from nanocrab.handlers.orchestrator import decide
    from nanocrab.handlers.runstate import RunState

    run = "r1"
    plan_input = {"steps": [{"intent": "look", "tools": ["read"]}, {"intent": "say", "tools": []}]}
    history: list[Any] = [
        TaskSubmitted(text="go", agent="planner", run_id=run, session_id="s"),
        RunStarted(agent="planner", max_steps=10),
        LlmRequested(turn=0, tools=["plan"]),
        LlmResponded(
            provider="p", model="m", content=[ToolUseBlock("p1", "plan", plan_input)],
            stop_reason="tool_use", turn=0,
        ),
        ToolRequested(call_id="p1", tool="plan", arguments=plan_input),
        Grant(
            grant_id="g", call_id="p1", tool="plan", capabilities=[], scope="step",
            expires_at=utcnow(), tier="safe",
        ),
    ]  # fmt: skip

    def state() -> RunState:
        s = RunState(run)
        for i, e in enumerate(history, 1):
            s.apply(e, i)
        return s

    accepted = decide(state(), utcnow())
    assert [e.type for e in accepted] == ["plan.created", "tool.resolved"]
    history.append(accepted[0])  # only plan.created landed
    again = decide(state(), utcnow())
    assert [e.type for e in again] == ["tool.resolved"], "the plan is not recorded twice"
    history.append(again[0])
    opened = decide(state(), utcnow())
    assert [e.type for e in opened] == ["plan.step_started", "llm.requested"]
    assert opened[1].tools == ["read"]  # type: ignore[attr-defined]
    history += opened
    history.append(LlmResponded(provider="p", model="m", content=[TextBlock("seen")],
                                stop_reason="end_turn", turn=1))  # fmt: skip
    ended = decide(state(), utcnow())
    assert [e.type for e in ended] == ["plan.step_completed", "plan.step_started", "llm.requested"]
    history.append(ended[0])  # the step's end landed, the next start did not
    resumed = decide(state(), utcnow())
    assert [e.type for e in resumed] == ["plan.step_started", "llm.requested"]
    assert resumed[0].index == 1 and resumed[1].tools == []  # type: ignore[attr-defined]
    history += resumed
    history.append(LlmResponded(provider="p", model="m", content=[TextBlock("all done")],
                                stop_reason="end_turn", turn=2))  # fmt: skip
    final = decide(state(), utcnow())
    assert [e.type for e in final] == ["plan.step_completed", "reply.sent", "run.completed"]
    history.append(final[0])
    assert [e.type for e in decide(state(), utcnow())] == ["reply.sent", "run.completed"]
