"""Guardrails: a YAML chain of filters (PII, secrets, prompt injection, allow/deny lists, tool
call alignment) checked at four checkpoints of a run — the task, tool output, tool calls, the
reply. This package is the pure library; the handler that turns verdicts into events lives in
``nanocrab.handlers``. Start with :func:`load_guardrails` and :func:`check`; docs/guardrails.md
describes the semantics and the measured quality.
"""

from nanocrab.guardrails.alignment import Alignment, check_alignment
from nanocrab.guardrails.chain import check, placeholder_key, prescreen
from nanocrab.guardrails.config import (
    GuardrailsConfig,
    GuardrailsError,
    load_guardrails,
    parse_guardrails,
)
from nanocrab.guardrails.model import (
    ACTION_RANK,
    CHECKPOINTS,
    Action,
    CheckContext,
    Checkpoint,
    Finding,
    Judgement,
    ToolCallView,
    Verdict,
)

__all__ = [
    "ACTION_RANK",
    "CHECKPOINTS",
    "Action",
    "Alignment",
    "CheckContext",
    "Checkpoint",
    "Finding",
    "GuardrailsConfig",
    "GuardrailsError",
    "Judgement",
    "ToolCallView",
    "Verdict",
    "check",
    "check_alignment",
    "load_guardrails",
    "parse_guardrails",
    "placeholder_key",
    "prescreen",
]
