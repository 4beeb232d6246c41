"""Model failover: which failures move a model call to the agent's next model, which fail the run.

An agent lists models after its own (``agents.yaml``: ``models: [...]``, each a model name on the
LLM handler's provider or ``{provider: NAME, model: NAME}``). For one model call the LLM handler
tries its model first, then each of these in order; the response says which answered
(``llm.responded`` ``provider``/``model``), and each move is an ``llm.failed`` with
``will_retry: true``, the ``model`` that failed and the ``failover_to`` target.

The policy, by the kind the provider gave the error (``llm/anthropic_errors.py``):

* ``retryable`` — rate limited (429), server errors (5xx), timeouts and lost connections: retried
  on the same model with backoff, up to the handler's ``max_attempts``; then the next model.
  ``overloaded`` (529, a provider outage in all but name) and the statuses in
  :attr:`FailoverPolicy.immediate` move on at once, without waiting out the retries, when
  another model is left.
* ``overflow`` — compacted and tried again on the same model, never moved: every model gets the
  same conversation.
* ``fatal`` — an invalid request (400), bad credentials or permissions (401/403), an unknown
  model (404), an exhausted quota: the run fails. Another model would get the same request, or
  hide a configuration mistake that someone must fix.

Only when the last model fails too does the call end in ``llm.failed`` (``will_retry: false``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nanocrab.llm.base import LlmError

OVERLOADED = 529


@dataclass(frozen=True, kw_only=True)
class FailoverPolicy:
    """``immediate``: HTTP statuses that move to the next model after one attempt;
    ``on``: the error kinds that move at all (after the retries)."""

    immediate: frozenset[int] = frozenset({OVERLOADED})
    on: frozenset[str] = frozenset({"retryable"})

    def moves(self, exc: LlmError) -> bool:
        """Whether ``exc``, once the retries are spent, moves the call to the next model."""
        return exc.kind in self.on

    def at_once(self, exc: LlmError) -> bool:
        """Whether ``exc`` moves to the next model without retrying this one."""
        return self.moves(exc) and exc.status_code in self.immediate


def label(provider: str | None, model: str) -> str:
    """How a failover target is named in events: ``provider/model`` (``model`` alone when it
    runs on the handler's own provider)."""
    return f"{provider}/{model}" if provider else model
