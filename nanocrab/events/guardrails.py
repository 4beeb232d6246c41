"""Guardrail verdicts and the alerts they raise (``handlers/guardrails.py`` writes both).

A verdict never carries a matched value: findings are spans in the checked text, and the only
text it carries is ``redacted_text`` — what the model (or the user) gets instead of the
original, present only when something was redacted.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from nanocrab.events.base import Event

GuardrailCheckpoint = Literal["task_input", "tool_output", "tool_call", "reply"]
GuardrailAction = Literal["allow", "alert", "redact", "require_approval", "block"]


class GuardrailFinding(msgspec.Struct, frozen=True, kw_only=True):
    """One thing a filter's detector found: a span of the checked text, never its value."""

    filter_id: str
    detector: str
    label: str
    kind: str
    start: int
    end: int
    score: float
    signals: list[str] = []


class GuardrailChecked(Event, frozen=True, tag="guardrail.checked"):
    """The chain's verdict on one text of a run at one checkpoint.

    ``target_id`` names what was checked: the tool call id (``tool_output``, ``tool_call``), the
    ``task.submitted`` / ``message.queued`` id (``task_input``) or the ``llm.responded`` id
    (``reply``). ``action`` is what the run does with it; ``error`` is set when a detector raised
    (the verdict is then ``block``: the handler fails closed).
    """

    checkpoint: GuardrailCheckpoint
    target_id: str
    action: GuardrailAction
    tool: str | None = None
    agent: str | None = None
    reason: str = ""
    filters_run: list[str] = []
    fired: list[str] = []
    alerts: list[str] = []
    findings: list[GuardrailFinding] = []
    redactions: int = 0
    redacted_text: str | None = None  # what the model / user sees; only when redacted
    placeholders_added: dict[str, str] = {}  # salted hash key -> placeholder, never values
    input_sha256: str = ""
    chain_source: str = ""  # the guardrails.yaml path, or "bundled"
    chain_sha256: str = ""
    error: str | None = None
    duration_ms: float = 0.0


class AlertRaised(Event, frozen=True, tag="alert.raised"):
    """Something a person should look at: a guardrail filter that asks for an alert fired.

    ``verdict_event_id`` is the ``guardrail.checked`` that raised it."""

    severity: Literal["info", "warning", "critical"]
    origin: str  # "guardrail"
    summary: str
    filter_id: str = ""
    checkpoint: GuardrailCheckpoint | None = None
    action: GuardrailAction | None = None
    labels: list[str] = []
    score: float = 0.0
    verdict_event_id: str | None = None
    tool: str | None = None


def screened_message(verdict: GuardrailChecked) -> str | None:
    """What a user's message (a task or a queued message, ``verdict.target_id``) becomes in
    every later context built from it — a session's history above all — when the
    ``task_input`` checkpoint redacted or blocked it; ``None`` when it passes unchanged.

    Redacted: the redacted text the model saw. Blocked: a note with the reason, never the text
    (a blocked injection must not reach the next run through its session's history)."""
    if verdict.checkpoint != "task_input":
        return None
    if verdict.action == "block":
        return f"[withheld by a guardrail: {verdict.reason or 'blocked'}]"
    if verdict.redacted_text is not None:
        return verdict.redacted_text
    return None
