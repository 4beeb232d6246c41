"""The guardrails vocabulary: checkpoints, findings, the check's context and its verdict.

Plain frozen dataclasses: :func:`nanocrab.guardrails.chain.check` is pure and synchronous, and
these values are what it takes and returns. Nothing here holds a matched value in clear: a
:class:`Finding` carries its span in the text that was checked (the caller has that text), so a
verdict can be turned into an event without copying a secret or a phone number into the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Checkpoint = Literal["task_input", "tool_output", "tool_call", "reply"]
"""Where a text is checked: the user's task (and queued messages), a tool's result before the
model reads it, the model's tool call (its arguments as text) before the policy sees it, and the
reply before it is sent."""

CHECKPOINTS: tuple[Checkpoint, ...] = ("task_input", "tool_output", "tool_call", "reply")

Action = Literal["allow", "alert", "redact", "require_approval", "block"]
"""What a filter does when its detector fires. Listed from weakest to strongest: the verdict's
action is the strongest action of the filters that fired (``allow`` also stops the chain)."""

ACTION_RANK: dict[Action, int] = {
    "allow": 0, "alert": 1, "redact": 2, "require_approval": 3, "block": 4,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a detector found.

    ``start``/``end`` index the checked text (``end`` exclusive); ``label`` is the entity or
    category (``EMAIL``, ``SECRET``, ``INJECTION``, ``DENY_DOMAIN`` ...) and names the redaction
    placeholder; ``kind`` refines it (``aws_access_key``, ``override``); ``score`` is in [0, 1];
    ``signals`` lists the evidence behind a scored finding (injection, alignment).
    """

    detector: str
    label: str
    kind: str
    start: int
    end: int
    score: float
    filter_id: str = ""
    signals: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCallView:
    """The tool call checked at the ``tool_call`` checkpoint (for the alignment detector)."""

    tool: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Judgement:
    """A model-based alignment check's answer on one tool call
    (:mod:`nanocrab.guardrails.alignment_llm`): ``aligned`` (``None`` when it could not
    answer — ``error`` says why), its ``confidence`` in [0, 1], a one-line ``reason`` and the
    ``model`` that answered."""

    aligned: bool | None
    confidence: float = 0.0
    reason: str = ""
    model: str = ""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CheckContext:
    """What the chain may know besides the text. All optional; filters scoped by tool or agent
    do not match when the context does not name one.

    ``task``: the user's task text (alignment); ``untrusted``: tool outputs the model read since
    the task (alignment); ``tool_call``: the call at the ``tool_call`` checkpoint;
    ``placeholders``: the run's placeholder table so far (see :func:`placeholder_key`), so that
    one value keeps one placeholder across checks of a run; ``salt``: mixed into the table's
    hashed keys (the run id, say), so a short value cannot be recovered by hashing guesses;
    ``judgement``: the model-based alignment check's answer on ``tool_call`` (the handler asks
    before running the chain, when a judge is configured and untrusted output was read);
    ``fast``: a pre-screen (:func:`nanocrab.guardrails.chain.prescreen`): detectors skip their
    slow layers (the learned classifier, the model-based alignment check) and report
    ``UNSURE`` where those layers would have been consulted.
    """

    tool: str | None = None
    agent: str | None = None
    task: str | None = None
    untrusted: tuple[str, ...] = ()
    tool_call: ToolCallView | None = None
    placeholders: Mapping[str, str] = field(default_factory=dict)
    salt: str = ""
    judgement: Judgement | None = None
    fast: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """The chain's decision on one text.

    ``filters_run``: ids of the filters whose scope matched, in order (the chain stops early on
    ``allow`` and ``block``); ``fired``: those whose detector found something at or above their
    threshold; ``findings``: what they found (spans in the checked text); ``action``: the
    strongest action among ``fired`` (``allow`` when none fired); ``alerts``: ids of fired filters
    that ask for an alert; ``text``: the text to pass on (redacted when ``action`` is ``redact``
    or stronger and some fired filter redacts; the original otherwise); ``placeholders``: the
    run's placeholder table including the ones this check added (keys are hashes, never values);
    ``reason``: one line for the model or the user when the action blocks or asks for approval;
    ``redactions``: how many spans ``text`` replaced with placeholders.
    """

    checkpoint: Checkpoint
    action: Action
    text: str
    filters_run: tuple[str, ...] = ()
    fired: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    alerts: tuple[str, ...] = ()
    placeholders: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""
    redactions: int = 0
