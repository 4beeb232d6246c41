"""Spending caps from ``policy.yaml``: the ``budgets`` section.

Format (every key optional)::

    budgets:
      run: {max_usd: 0.50, max_tokens: 200000}       # every run
      session: {max_usd: 5.0}                        # all the runs of one session together
      agents:                                        # all the runs of an agent, by agent name
        default: {max_usd: 20.0}
        "*": {max_tokens: 5000000}                   # any agent not listed
      tenants:                                       # all the runs of a tenant
        acme: {max_usd: 100.0}
        "*": {max_usd: 10.0}

A task may carry its own ``budget`` (``task.submitted.budget``): it applies to that run on top
of ``run`` (the stricter of the two wins, per kind). Tokens are input + output + cache read +
cache write tokens; dollars come from the pricing table (``nanocrab/llm/pricing.py``). The
orchestrator checks before each model call (``handlers/orchestrator/budget.py``).

What a run over a cap does is the cap's ``on_exceed``::

    budgets:
      run: {max_usd: 0.50, on_exceed: ask, raise_usd: 0.25}

- ``fail`` (default): ``budget.exceeded`` + ``run.failed{kind: budget}``;
- ``ask``: ``budget.exceeded{on_exceed: ask}``, then the policy handler asks a person through the
  approval flow (``nanocrab approvals`` / ``approve`` / ``deny``, the prompt of ``nanocrab
  run``). Approved: ``budget.raised`` and the run goes on with that cap one increment higher for
  the rest of the run — ``raise_usd`` / ``raise_tokens``, by default the cap itself again —; it
  asks again when that is spent too. Denied, expired or nobody to ask: ``budget.refused`` +
  ``run.failed{kind: budget}``. A raise applies to the run that asked only, also for a session,
  agent or tenant cap. A task's own ``budget`` has no ``on_exceed``: the run cap (the stricter
  of it and ``run``) follows ``run``'s.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, PositiveFloat, PositiveInt

from nanocrab.events import OnExceed


class Limit(BaseModel):
    """A cap in dollars, in tokens, or both; ``None`` leaves that kind uncapped. ``on_exceed``:
    what a run over it does (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_usd: PositiveFloat | None = None
    max_tokens: PositiveInt | None = None
    on_exceed: OnExceed = "fail"
    raise_usd: PositiveFloat | None = None  # ``ask``: what one approval adds (default max_usd)
    raise_tokens: PositiveInt | None = None  # ``ask``: likewise (default max_tokens)


class Budgets(BaseModel):
    """The ``budgets`` section of a policy (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: Limit | None = None
    session: Limit | None = None
    agents: dict[str, Limit] = {}
    tenants: dict[str, Limit] = {}

    def agent(self, name: str) -> Limit | None:
        """The cap of agent ``name``'s runs together (its own entry, else ``*``)."""
        return self.agents.get(name, self.agents.get("*"))

    def tenant(self, name: str) -> Limit | None:
        """The cap of tenant ``name``'s runs together (its own entry, else ``*``)."""
        return self.tenants.get(name, self.tenants.get("*"))

    @property
    def any(self) -> bool:
        """Whether any cap is set at all (without one, no model call is checked)."""
        return self.run is not None or self.shared

    @property
    def shared(self) -> bool:
        """Whether any cap spans several runs (so the check needs the usage of other runs)."""
        return self.session is not None or bool(self.agents) or bool(self.tenants)
