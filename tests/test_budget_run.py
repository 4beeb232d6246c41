"""Budgets on the real agent loop: a run over its cap ends with ``budget.exceeded`` and
``run.failed{kind: budget}``, the audit and the timeline record it, and a tenant cap counts the
spending of the tenant's other runs through the usage projection."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import EventLog
from nanocrab.cli.wiring import ProjectedUsage
from nanocrab.events import Budget, BudgetExceeded, LlmRequested, LlmResponded, RunFailed
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.llm import ScriptedProvider
from nanocrab.policy.budgets import Budgets, Limit
from nanocrab.projections.audit import budget_stops
from nanocrab.projections.timeline import run_timeline_rows
from nanocrab.projections.usage import usage_rows

from .agent_fixtures import agent_reactors, finished, of_type, running_host, submit
from .conftest import eventually

LOOPING = """
scripts:
  - name: main
    turns:
      - tool_calls: [{name: ls, input: {path: "."}}]
      - tool_calls: [{name: read, input: {path: README.md}}]
      - tool_calls: [{name: read, input: {path: greet.py}}]
      - text: "finished"
"""


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return demo.make_workspace(tmp_path / "ws")


def reactors(log: EventLog, engine: AsyncEngine, workspace: Path, budgets: Budgets) -> list:  # type: ignore[type-arg]
    provider = ScriptedProvider.from_text(LOOPING)
    loop = agent_reactors(log, engine, provider, workspace, orchestrators=())
    return [Orchestrator(log, budgets=budgets, usage=ProjectedUsage(engine)), *loop]


async def test_a_task_budget_stops_the_run_before_the_next_model_call(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    async with running_host(log, engine, reactors(log, engine, workspace, Budgets())):
        task = submit("look around", workspace, budget=Budget(max_tokens=1))
        await log.append(task)
        events = await finished(log, task.run_id or "")
        (over,) = of_type(events, BudgetExceeded)
        (failed,) = of_type(events, RunFailed)
        assert len(of_type(events, LlmRequested)) == len(of_type(events, LlmResponded)) == 1
        assert (over.scope, over.limit, over.turn, over.max_tokens) == ("run", "tokens", 1, 1)
        assert over.spent_tokens == of_type(events, LlmResponded)[0].usage.input_tokens + (
            of_type(events, LlmResponded)[0].usage.output_tokens
        )
        assert failed.kind == "budget" and "run budget" in failed.reason

        async def audited() -> list:  # type: ignore[type-arg]
            return await budget_stops(engine, run_id=task.run_id)

        (row,) = await eventually(audited)
        assert (row.scope, row.limit_kind, row.spent_tokens) == ("run", "tokens", over.spent_tokens)

        async def in_timeline() -> bool:
            rows = await run_timeline_rows(engine, task.run_id or "")
            return any(r.type == "budget.exceeded" and "spent" in r.summary for r in rows)

        await eventually(in_timeline)


async def test_a_tenant_cap_counts_the_tenants_other_runs(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    tenant = f"t{tmp_path.name[-12:]}".replace("_", "-")
    budgets = Budgets(tenants={tenant: Limit(max_tokens=1)})
    async with running_host(log, engine, reactors(log, engine, workspace, budgets)):
        first = submit("look around", workspace, tenant=tenant)
        await log.append(first)
        events = await finished(log, first.run_id or "")
        (over,) = of_type(events, BudgetExceeded)
        assert (over.scope, over.key, over.turn) == ("tenant", tenant, 1)
        spent = over.spent_tokens

        async def projected() -> bool:
            rows = await usage_rows(engine, "tenant", tenant=tenant)
            return bool(rows) and rows[0].tokens == spent

        await eventually(projected)
        second = submit("look around", workspace, tenant=tenant)
        await log.append(second)
        events = await finished(log, second.run_id or "")
        (over,) = of_type(events, BudgetExceeded)
        assert over.turn == 0 and over.spent_tokens == spent, "stopped before its first call"
        assert not of_type(events, LlmRequested)
        (row,) = await usage_rows(engine, "run", tenant=tenant)
        assert row.key == first.run_id and row.calls == 1
