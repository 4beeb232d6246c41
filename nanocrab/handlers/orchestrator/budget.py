"""The budget check before a model call, as a pure function of the run and a usage view.

The run's own spending is folded from its ``llm.responded`` events (exact); the spending of the
other runs of its session, agent and tenant comes in as :class:`Spending` from an injected
:class:`UsageView` (the usage projection: it trails the log by the projector's batch delay, so a
burst of runs started at once can overshoot a shared cap by what they spend meanwhile — the run
cap never overshoots by more than one model call).

A cap set to ``on_exceed: ask`` makes the ``budget.exceeded`` carry the increment an approval
would add; the raises a person approved for the run (its trusted ``budget.raised`` events) are
added to the caps they name before the check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from nanocrab.events import Budget, BudgetExceeded, BudgetScope, OnExceed
from nanocrab.handlers.runstate import RunState
from nanocrab.policy.budgets import Budgets, Limit


@dataclass(frozen=True, slots=True)
class Spent:
    """Dollars and tokens spent on model calls."""

    usd: float = 0.0
    tokens: int = 0

    def __add__(self, other: Spent) -> Spent:
        return Spent(self.usd + other.usd, self.tokens + other.tokens)


@dataclass(frozen=True, slots=True)
class Spending:
    """What the *other* runs of a run's session, agent and tenant spent (the run excluded)."""

    session: Spent = Spent()
    agent: Spent = Spent()
    tenant: Spent = Spent()


class UsageView(Protocol):
    """Spending of other runs, for the shared caps (implemented over the usage projection)."""

    async def spending(
        self, *, run_id: str, session_id: str | None, agent: str, tenant: str
    ) -> Spending: ...


def run_spent(state: RunState) -> Spent:
    """What the run's model calls cost so far, from its ``llm.responded`` events."""
    usd, tokens = 0.0, 0
    for turn in state.turns:
        if (r := turn.response) is not None:
            u = r.usage
            usd += r.cost_usd
            tokens += u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_write_tokens
    return Spent(usd, tokens)


def _tighter(a: Limit | Budget | None, b: Limit | Budget | None) -> Budget | None:
    if a is None and b is None:
        return None
    usd = [x.max_usd for x in (a, b) if x is not None and x.max_usd is not None]
    tokens = [x.max_tokens for x in (a, b) if x is not None and x.max_tokens is not None]
    return Budget(max_usd=min(usd) if usd else None, max_tokens=min(tokens) if tokens else None)


def _raised(cap: Budget | None, raises: list[Budget]) -> Budget | None:
    """``cap`` with the approved ``raises`` added (a kind the cap leaves open stays open)."""
    if cap is None or not raises:
        return cap
    usd = sum(r.max_usd or 0.0 for r in raises)
    tokens = sum(r.max_tokens or 0 for r in raises)
    return Budget(
        max_usd=None if cap.max_usd is None else cap.max_usd + usd,
        max_tokens=None if cap.max_tokens is None else cap.max_tokens + tokens,
    )


def _increment(limit: Limit | None, cap: Budget) -> Budget | None:
    """What one approval adds to ``cap`` when its policy ``limit`` asks (``None``: it fails)."""
    if limit is None or limit.on_exceed != "ask":
        return None
    return Budget(
        max_usd=(limit.raise_usd or cap.max_usd) if cap.max_usd is not None else None,
        max_tokens=(limit.raise_tokens or cap.max_tokens) if cap.max_tokens is not None else None,
    )


def over_budget(
    state: RunState,
    budgets: Budgets,
    spending: Spending,
    *,
    agent: str,
    turn: int,
) -> BudgetExceeded | None:
    """The first cap the run's next model call (``turn``) would go past, or ``None``.

    Scopes are checked run, session, agent, tenant; in each, dollars before tokens. A cap is
    reached when the spending is at or above it: the call is not made. A cap is checked with
    the run's approved raises of it added (``state.budget_raises``)."""
    assert state.task is not None
    mine = run_spent(state)
    tenant = state.task.tenant
    checks: list[tuple[BudgetScope, str, Limit | None, Budget | None, Spent]] = [
        ("run", state.run_id, budgets.run, _tighter(budgets.run, state.task.budget), mine),
        ("session", state.task.session_id or "-", budgets.session, _tighter(budgets.session, None),
         mine + spending.session),
        ("agent", agent, budgets.agent(agent), _tighter(budgets.agent(agent), None),
         mine + spending.agent),
        ("tenant", tenant, budgets.tenant(tenant), _tighter(budgets.tenant(tenant), None),
         mine + spending.tenant),
    ]  # fmt: skip
    for scope, key, limit, base, spent in checks:
        if base is None or (scope == "session" and state.task.session_id is None):
            continue
        raises = [r.increment for r in state.budget_raises if (r.scope, r.key) == (scope, key)]
        cap = _raised(base, raises)
        assert cap is not None
        kind: Literal["usd", "tokens"] | None = None
        if cap.max_usd is not None and spent.usd >= cap.max_usd:
            kind = "usd"
        elif cap.max_tokens is not None and spent.tokens >= cap.max_tokens:
            kind = "tokens"
        if kind is not None:
            increment = _increment(limit, base)
            on_exceed: OnExceed = "ask" if increment is not None else "fail"
            return BudgetExceeded(
                scope=scope,
                key=key,
                limit=kind,
                spent_usd=round(spent.usd, 6),
                spent_tokens=spent.tokens,
                max_usd=cap.max_usd,
                max_tokens=cap.max_tokens,
                turn=turn,
                on_exceed=on_exceed,
                increment=increment,
            )
    return None
