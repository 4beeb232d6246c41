"""Spending limits: the budget a task may carry, the event that stops a run over budget, and the
answer to a run that asked a person for more (``budget.raised`` / ``budget.refused``)."""

from __future__ import annotations

from typing import Literal

import msgspec

from nanocrab.events.base import Event

BudgetScope = Literal["run", "session", "agent", "tenant"]
OnExceed = Literal["fail", "ask"]


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """A cap on what model calls may cost: ``max_usd`` (US dollars, priced by
    ``nanocrab/llm/pricing.py``) and ``max_tokens`` (input + output + cache read + cache write
    tokens, as the provider reports them). ``None``: no cap of that kind."""

    max_usd: float | None = None
    max_tokens: int | None = None


class BudgetExceeded(Event, frozen=True, tag="budget.exceeded"):
    """The orchestrator did not make the run's next model call: what was spent in ``scope``
    (the run itself, its session, its agent or its tenant; ``key`` names which) reached a cap.
    ``on_exceed`` (the cap's setting in the policy): ``fail`` — the run then ends with
    ``run.failed{kind: budget}``; ``ask`` — the run waits while the policy handler asks a person
    (``approval.requested{about: budget}``) whether it may spend ``increment`` more, and goes on
    after a ``budget.raised`` or ends after a ``budget.refused``.

    ``spent_usd`` / ``spent_tokens``: the spending the check saw — exact for the run (its own
    ``llm.responded`` events), from the usage projection for the wider scopes (which trails the
    log by its batch delay). ``max_usd`` / ``max_tokens``: the cap as it stood, earlier raises
    of this run included. ``turn``: the model call that was not made."""

    scope: BudgetScope
    key: str
    limit: Literal["usd", "tokens"]
    spent_usd: float
    spent_tokens: int
    max_usd: float | None = None
    max_tokens: int | None = None
    turn: int = 0
    on_exceed: OnExceed = "fail"
    increment: Budget | None = None  # ``ask``: what an approval adds to the cap


class BudgetRaised(Event, frozen=True, kw_only=True, tag="budget.raised"):
    """A person approved more spending for the run: the cap of ``scope``/``key`` is ``increment``
    higher for the rest of this run (other runs of a session, agent or tenant are not raised).
    Emitted by the policy handler for the trusted answer to the approval it asked for
    ``exceeded_id``, and signed with its key (the orchestrator believes only that signature)."""

    exceeded_id: str
    approval_id: str
    scope: BudgetScope
    key: str
    increment: Budget
    approver: str = ""
    signer: str = ""
    signature: str = ""


class BudgetRefused(Event, frozen=True, kw_only=True, tag="budget.refused"):
    """No more spending for the run: the approval asked for ``exceeded_id`` was ``denied``,
    ``expired``, or could not be asked (``no_approver``). The run then ends with
    ``run.failed{kind: budget}``. Emitted by the policy handler."""

    exceeded_id: str
    answer: Literal["denied", "expired", "no_approver"]
    approval_id: str | None = None
    reason: str = ""
