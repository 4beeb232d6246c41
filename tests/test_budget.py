"""Budgets: the orchestrator's check before each model call, as a pure function."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest

from nanocrab.events import (
    Budget,
    BudgetExceeded,
    Event,
    GrantIssued,
    LlmRequested,
    LlmResponded,
    RunFailed,
    RunStarted,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolUseBlock,
    Usage,
    utcnow,
)
from nanocrab.handlers.orchestrator import decide
from nanocrab.handlers.orchestrator.budget import Spending, Spent, run_spent
from nanocrab.handlers.runstate import RunState
from nanocrab.policy import Policy, PolicyError
from nanocrab.policy.budgets import Budgets, Limit

RUN = "run1"


def state_of(*events: Event) -> RunState:
    """The run's state from ``events``, all of the task's tenant (as every handler stamps
    them: a run folds no other tenant's events)."""
    state = RunState(RUN)
    for i, e in enumerate(events, 1):
        state.apply(msgspec.structs.replace(e, tenant="acme"), i)
    return state


def task(**kw: object) -> TaskSubmitted:
    return TaskSubmitted(text="go", run_id=RUN, session_id="s1", tenant="acme", **kw)  # type: ignore[arg-type]


def called(turn: int, usd: float, tokens: int) -> list[Event]:
    """One model call asking for a tool, and the tool's result."""
    return [
        LlmResponded(
            provider="anthropic",
            model="claude-sonnet-4-5",
            content=[ToolUseBlock(f"c{turn}", "read", {"path": "a"})],
            stop_reason="tool_use",
            turn=turn,
            usage=Usage(input_tokens=tokens - 10, output_tokens=10),
            cost_usd=usd,
        ),
        ToolCompleted(call_id=f"c{turn}", tool="read", content=[TextBlock("ok")]),
    ]


def after_one_call(usd: float = 0.3, tokens: int = 1000, **kw: object) -> RunState:
    return state_of(
        task(**kw), RunStarted(max_steps=9), LlmRequested(turn=0), *called(0, usd, tokens)
    )


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def test_without_budgets_the_next_call_is_made() -> None:
    assert types(decide(after_one_call(), utcnow())) == ["llm.requested"]


def test_run_spending_is_folded_from_its_responses() -> None:
    assert run_spent(after_one_call(0.25, 1234)) == Spent(0.25, 1234)


def test_a_run_at_its_dollar_cap_ends_over_budget() -> None:
    out = decide(after_one_call(0.3), utcnow(), budgets=Budgets(run=Limit(max_usd=0.3)))
    assert types(out) == ["budget.exceeded", "run.failed"]
    over, failed = out
    assert isinstance(over, BudgetExceeded) and isinstance(failed, RunFailed)
    assert (over.scope, over.key, over.limit, over.turn) == ("run", RUN, "usd", 1)
    assert over.spent_usd == 0.3 and over.max_usd == 0.3
    assert failed.kind == "budget" and "run budget" in failed.reason


def test_below_the_cap_the_call_is_made() -> None:
    out = decide(after_one_call(0.29), utcnow(), budgets=Budgets(run=Limit(max_usd=0.3)))
    assert types(out) == ["llm.requested"]


def test_the_task_budget_caps_tokens_and_the_stricter_cap_wins() -> None:
    state = after_one_call(0.01, 1000, budget=Budget(max_tokens=1000))
    out = decide(state, utcnow(), budgets=Budgets(run=Limit(max_tokens=50_000)))
    assert types(out) == ["budget.exceeded", "run.failed"]
    assert out[0].limit == "tokens" and out[0].max_tokens == 1000  # type: ignore[attr-defined]
    # a task budget alone (no policy caps) is enforced too
    assert types(decide(state, utcnow())) == ["budget.exceeded", "run.failed"]


@pytest.mark.parametrize(
    ("budgets", "spending", "scope", "key"),
    [
        (Budgets(session=Limit(max_usd=1.0)), Spending(session=Spent(0.8, 0)), "session", "s1"),
        (Budgets(agents={"default": Limit(max_usd=1.0)}), Spending(agent=Spent(0.7, 0)), "agent",
         "default"),
        (Budgets(agents={"*": Limit(max_tokens=5000)}), Spending(agent=Spent(0, 4000)), "agent",
         "default"),
        (Budgets(tenants={"acme": Limit(max_usd=1.0)}), Spending(tenant=Spent(0.9, 0)), "tenant",
         "acme"),
    ],
)  # fmt: skip
def test_shared_caps_add_the_other_runs_spending(
    budgets: Budgets, spending: Spending, scope: str, key: str
) -> None:
    state = after_one_call(0.3, 1000)
    assert types(decide(state, utcnow(), budgets=budgets)) == ["llm.requested"]
    out = decide(state, utcnow(), budgets=budgets, spending=spending)
    assert types(out) == ["budget.exceeded", "run.failed"]
    assert (out[0].scope, out[0].key) == (scope, key)  # type: ignore[attr-defined]


def test_another_tenants_cap_does_not_apply() -> None:
    budgets = Budgets(tenants={"other": Limit(max_usd=0.01)})
    out = decide(after_one_call(), utcnow(), budgets=budgets, spending=Spending(tenant=Spent(9, 9)))
    assert types(out) == ["llm.requested"]


def test_a_tenant_over_its_cap_cannot_start_a_run() -> None:
    budgets = Budgets(tenants={"acme": Limit(max_usd=1.0)})
    out = decide(
        state_of(task()), utcnow(), budgets=budgets, spending=Spending(tenant=Spent(1.5, 0))
    )
    assert types(out) == ["run.started", "budget.exceeded", "run.failed"]


def test_once_over_budget_every_decision_only_ends_the_run() -> None:
    """The decision lands one event at a time: decided again after ``budget.exceeded``
    landed alone, the run ends without a second ``budget.exceeded``."""
    budgets = Budgets(run=Limit(max_usd=0.3))
    state = after_one_call(0.3)
    first = decide(state, utcnow(), budgets=budgets)
    state.apply(msgspec.structs.replace(first[0], tenant="acme"), 99)  # stamped, as appended
    again = decide(state, utcnow(), budgets=budgets)
    assert types(again) == ["run.failed"]
    state.apply(msgspec.structs.replace(again[0], tenant="acme"), 100)
    assert decide(state, utcnow(), budgets=budgets) == []


def test_a_spawned_child_inherits_the_task_budget() -> None:
    args: dict[str, object] = {"task": "look", "agent": "explorer"}
    s = state_of(
        task(budget=Budget(max_usd=2.0)), RunStarted(max_steps=9), LlmRequested(turn=0),
        LlmResponded(provider="p", model="m", stop_reason="tool_use", turn=0,
                     content=[ToolUseBlock("c0", "spawn", args)]),
        ToolRequested(call_id="c0", tool="spawn", arguments=args),
        GrantIssued(grant_id="g", call_id="c0", tool="spawn", capabilities=[], scope="step",
                    tier="safe", expires_at=utcnow() + timedelta(minutes=5)),
    )  # fmt: skip
    out = decide(s, utcnow())
    assert types(out) == ["subagent.spawned", "task.submitted"]
    assert out[1].budget == Budget(max_usd=2.0)  # type: ignore[attr-defined]


def test_policy_files_take_budgets_and_refuse_unknown_keys() -> None:
    policy = Policy.from_mapping(
        {"version": 1, "budgets": {"run": {"max_usd": 0.5}, "tenants": {"*": {"max_tokens": 9}}}}
    )
    assert policy.budgets.run == Limit(max_usd=0.5)
    assert policy.budgets.tenant("anyone") == Limit(max_tokens=9)
    assert policy.budgets.shared
    with pytest.raises(PolicyError):
        Policy.from_mapping({"version": 1, "budgets": {"run": {"max_dollars": 1}}})
    with pytest.raises(PolicyError):
        Policy.from_mapping({"version": 1, "budgets": {"run": {"max_usd": -1}}})
