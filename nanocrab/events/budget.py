"""Spending limits: the budget a task may carry, and the event that ends a run over budget."""

from __future__ import annotations

from typing import Literal

import msgspec

from nanocrab.events.base import Event

BudgetScope = Literal["run", "session", "agent", "tenant"]


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """A cap on what model calls may cost: ``max_usd`` (US dollars, priced by
    ``nanocrab/llm/pricing.py``) and ``max_tokens`` (input + output + cache read + cache write
    tokens, as the provider reports them). ``None``: no cap of that kind."""

    max_usd: float | None = None
    max_tokens: int | None = None


class BudgetExceeded(Event, frozen=True, tag="budget.exceeded"):
    """The orchestrator did not make the run's next model call: what was spent in ``scope``
    (the run itself, its session, its agent or its tenant; ``key`` names which) reached a cap.
    The run then ends with ``run.failed{kind: budget}``.

    ``spent_usd`` / ``spent_tokens``: the spending the check saw — exact for the run (its own
    ``llm.responded`` events), from the usage projection for the wider scopes (which trails the
    log by its batch delay). ``turn``: the model call that was not made."""

    scope: BudgetScope
    key: str
    limit: Literal["usd", "tokens"]
    spent_usd: float
    spent_tokens: int
    max_usd: float | None = None
    max_tokens: int | None = None
    turn: int = 0
