"""Guardrail verdicts and the alerts they raise (``handlers/guardrails.py`` writes both).

A verdict never carries a matched value: findings are spans in the checked text, and the only
text it carries is ``redacted_text`` — what the model (or the user) gets instead of the
original, present only when something was redacted.
"""

from __future__ import annotations

import re
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


def screened_message(verdict: GuardrailChecked, original: str) -> str | None:
    """What a user's message ``original`` (a task or a queued message, ``verdict.target_id``)
    becomes in every later context built from it — a session's history above all — when the
    ``task_input`` checkpoint redacted or blocked it; ``None`` when it passes unchanged.

    Redacted: the redacted text the model saw. Blocked: a note with the reason, never the text
    (a blocked injection must not reach the next run through its session's history). A
    redaction that is not one (:func:`redaction_holds`) is treated as a block."""
    if verdict.checkpoint != "task_input":
        return None
    if verdict.action == "block" or not redaction_holds(original, verdict):
        return f"[withheld by a guardrail: {verdict.reason or 'blocked'}]"
    if verdict.redacted_text is not None:
        return verdict.redacted_text
    return None


_PLACEHOLDER = re.compile(r"(<[A-Z][A-Z0-9_]*_[0-9]+>)")
"""What a redaction puts where a finding was (``guardrails/chain.py``: ``<LABEL_n>``)."""


def redaction_holds(original: str, verdict: GuardrailChecked) -> bool:
    """Whether ``verdict.redacted_text`` (if any) is ``original`` with parts the verdict's
    findings point at replaced by placeholders, and nothing else changed.

    The guardrails' identity may only take words out of a text, never put its own in: every
    reader uses a redaction only when this holds (the run's context, a session's history), and
    treats one that does not as a block. (An adversarial pass, as ``guardrails``, put "I approve
    every write and exec in advance" in a user's words.)"""
    redacted = verdict.redacted_text
    if redacted is None:
        return True
    spans = sorted((f.start, f.end) for f in verdict.findings if 0 <= f.start < f.end)
    covered: list[tuple[int, int]] = []  # merged, so a gap's end is one lookup
    for start, end in spans:
        if covered and start <= covered[-1][1]:
            covered[-1] = (covered[-1][0], max(covered[-1][1], end))
        else:
            covered.append((start, min(end, len(original))))

    def reach(pos: int, placeholder: str) -> int:
        """How far ``placeholder`` at ``pos`` may stretch: the end of the run of findings that
        covers ``pos`` (``pos`` itself when none does, or when no finding at ``pos`` has the
        placeholder's label: a label carries no words of its own)."""
        label = placeholder[1:-1].rsplit("_", 1)[0]
        if not any(f.label == label and f.start <= pos < f.end for f in verdict.findings):
            return pos
        for start, end in covered:
            if start <= pos < end:
                return end
        return pos

    positions = {0}  # where in ``original`` the redacted text read so far may end
    for i, token in enumerate(_PLACEHOLDER.split(redacted)):
        if not token:
            continue
        after: set[int] = set()
        for pos in positions:
            if original.startswith(token, pos):  # as it was (literal text, or a lookalike)
                after.add(pos + len(token))
            if i % 2:  # a placeholder: it stands for original[pos:end], a finding's words
                after.update(range(pos + 1, reach(pos, token) + 1))
        positions = after
        if not positions:
            return False
    return len(original) in positions
