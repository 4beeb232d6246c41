"""The guardrails handler: runs the ``guardrails.yaml`` chain at a run's checkpoints and records
each verdict as ``guardrail.checked`` (plus ``alert.raised`` for filters that ask for one).

Consumes, for the checkpoints the chain has a filter for (none: the type is not consumed, no hop):

- ``task_input``: ``task.submitted`` and ``message.queued`` (subject: their event id);
- ``tool_output``: ``tool.completed`` (subject: the call id), before the model reads it;
- ``tool_call``: ``llm.responded`` — each ``tool_use`` block (subject: the call id; the text
  checked is the arguments as JSON, the structured call goes to the alignment detector), before
  the orchestrator asks the policy;
- ``reply``: ``llm.responded`` without tool calls (subject: the response's event id), before
  ``reply.sent``.

The orchestrator waits for these verdicts only where ``run.started.guarded`` says so, and acts on
them (``handlers/orchestrator/decide.py``); the model's context is built from the verdict's text
(``handlers/conversation.py``). Apart from ``task.submitted`` (checked before ``run.started``
exists, since the chain is what decides which checkpoints get pinned), a run that did not pin a
checkpoint is not checked there.

The core, :func:`screen`, is a function of the chain, the run's state and the event; the reactor
only loads the state and hands alerts to the optional webhook. Redelivery is harmless: a subject
already judged in the state is skipped, and reaction ids derive from the cause. A detector that
raises fails closed: the verdict is ``block`` with the error named (never the text).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nanocrab.bus import Delivery, EventLog
from nanocrab.events import (
    AlertRaised,
    Event,
    GuardrailChecked,
    GuardrailCheckpoint,
    GuardrailFinding,
    LlmResponded,
    MessageQueued,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolUseBlock,
    derive_event_id,
)
from nanocrab.guardrails import (
    CheckContext,
    GuardrailsConfig,
    ToolCallView,
    Verdict,
    check,
)
from nanocrab.handlers.alerts import AlertSink
from nanocrab.handlers.conversation import text_of
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.runstate import RunState

NAME = "guardrails"


@dataclass(frozen=True, slots=True)
class Chain:
    """A loaded chain and where it came from (recorded in every verdict)."""

    config: GuardrailsConfig
    source: str
    sha256: str

    @classmethod
    def of(cls, config: GuardrailsConfig, text: str | None = None) -> Chain:
        """``text``: the file's bytes as read (for the digest); default: the parsed chain."""
        body = text if text is not None else config.model_dump_json()
        return cls(config, config.source, hashlib.sha256(body.encode()).hexdigest())

    def guarded(self) -> frozenset[str]:
        """The checkpoints a run started now pins (``run.started.guarded``)."""
        return frozenset(
            c for c in ("task_input", "tool_output", "tool_call", "reply")
            if self.config.has_filter_for(c)
        )  # fmt: skip


def consumed(chain: Chain) -> tuple[type[Event], ...]:
    """The event types the handler needs for ``chain``'s checkpoints."""
    guarded = chain.guarded()
    types: list[type[Event]] = []
    if "task_input" in guarded:
        types += [TaskSubmitted, MessageQueued]
    if "tool_output" in guarded:
        types.append(ToolCompleted)
    if guarded & {"tool_call", "reply"}:
        types.append(LlmResponded)
    return tuple(types)


def screen(chain: Chain, state: RunState, event: Event, source: str = NAME) -> list[Event]:
    """The verdicts (and alerts) on what ``event`` brings into the run, given the run's
    ``state`` (folded at least up to ``event``). ``source`` names the handler in event ids."""
    task = state.task
    if task is None:
        return []
    jobs: list[tuple[GuardrailCheckpoint, str, str, str | None, ToolCallView | None]] = []
    match event:
        case TaskSubmitted():
            if event.id == task.id and not task.text.strip().startswith("/"):
                jobs.append(("task_input", event.id, task.text, None, None))
        case MessageQueued():
            # before run.started the pinning is not known yet: the chain decides (as it will)
            early = state.started is None and "task_input" in chain.guarded()
            if state.guarded("task_input") or early:
                jobs.append(("task_input", event.id, event.text, None, None))
        case ToolCompleted():
            blocked = state.verdict("tool_call", event.call_id)
            # a call the guardrails refused has no output to check (its result is their own)
            if state.guarded("tool_output") and (
                blocked is None or blocked.action not in ("block", "redact")
            ):
                text = "\n".join(b.text for b in event.content if isinstance(b, TextBlock))
                jobs.append(("tool_output", event.call_id, text, event.tool, None))
        case LlmResponded():
            uses = [b for b in event.content if isinstance(b, ToolUseBlock)]
            if uses and state.guarded("tool_call"):
                for b in uses:
                    args = json.dumps(b.input, ensure_ascii=False, sort_keys=True, default=str)
                    jobs.append(("tool_call", b.id, args, b.name, ToolCallView(b.name, b.input)))
            elif not uses and state.guarded("reply"):
                jobs.append(("reply", event.id, text_of(event.content), None, None))
    out: list[Event] = []
    placeholders = dict(state.placeholders)
    task_text = state.screened("task_input", task.id, task.text) or ""
    untrusted = tuple(_outputs(state)) if any(j[0] == "tool_call" for j in jobs) else ()
    for checkpoint, subject_id, text, tool, call in jobs:
        if state.verdict(checkpoint, subject_id) is not None:
            continue  # judged already (a redelivery)
        context = CheckContext(
            tool=tool, agent=task.agent, task=task_text, untrusted=untrusted, tool_call=call,
            placeholders=placeholders, salt=state.run_id,
        )  # fmt: skip
        checked = _checked(chain, checkpoint, subject_id, text, context)
        placeholders.update(checked.placeholders_added)
        verdict_id = derive_event_id(source, event.id, len(out))
        out.append(checked)
        out += _alerts(checked, verdict_id)
    return out


def _checked(chain: Chain, checkpoint: GuardrailCheckpoint, subject_id: str, text: str,
             context: CheckContext) -> GuardrailChecked:  # fmt: skip
    started = time.perf_counter()
    error: str | None = None
    try:
        verdict = check(chain.config, checkpoint, text, context)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
        verdict = Verdict(checkpoint=checkpoint, action="block", text=text,
                          placeholders=context.placeholders,
                          reason=f"the guardrails could not check this ({type(exc).__name__}); "
                                 "blocked to be safe")  # fmt: skip
    added = {k: v for k, v in verdict.placeholders.items() if k not in context.placeholders}
    redacted = verdict.redactions > 0 and verdict.action != "block"
    return GuardrailChecked(
        checkpoint=checkpoint,
        target_id=subject_id,
        action=verdict.action,
        tool=context.tool,
        agent=context.agent,
        reason=verdict.reason,
        filters_run=list(verdict.filters_run),
        fired=list(verdict.fired),
        alerts=list(verdict.alerts),
        findings=[
            GuardrailFinding(
                filter_id=f.filter_id, detector=f.detector, label=f.label, kind=f.kind,
                start=f.start, end=f.end, score=round(f.score, 3), signals=list(f.signals),
            )
            for f in verdict.findings
        ],
        redactions=verdict.redactions,
        redacted_text=verdict.text if redacted else None,
        placeholders_added=added,
        input_sha256=hashlib.sha256(text.encode()).hexdigest(),
        chain_source=chain.source,
        chain_sha256=chain.sha256,
        error=error,
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
    )


def _alerts(checked: GuardrailChecked, verdict_id: str) -> list[AlertRaised]:
    out: list[AlertRaised] = []
    for fid in checked.alerts:
        mine = [f for f in checked.findings if f.filter_id == fid]
        labels = sorted({f.label for f in mine})
        score = max((f.score for f in mine), default=0.0)
        what = ", ".join(labels) or "a finding"
        out.append(
            AlertRaised(
                severity="critical" if checked.action == "block" else "warning",
                origin="guardrail",
                filter_id=fid,
                checkpoint=checked.checkpoint,
                action=checked.action,
                labels=labels,
                score=score,
                summary=f"guardrail {fid!r} found {what} at {checked.checkpoint}"
                + (f" ({checked.tool})" if checked.tool else "")
                + f": {checked.action}",
                verdict_event_id=verdict_id,
                tool=checked.tool,
            )
        )
    if checked.error is not None:
        out.append(
            AlertRaised(
                severity="critical", origin="guardrail", checkpoint=checked.checkpoint,
                action="block", summary=f"a guardrail detector failed: {checked.error}",
                verdict_event_id=verdict_id, tool=checked.tool,
            )
        )  # fmt: skip
    return out


def _outputs(state: RunState) -> list[str]:
    """The tool outputs the model has read since the task, as it read them (alignment)."""
    out: list[str] = []
    for turn in state.turns:
        for call in turn.calls:
            if call.completed is None:
                continue
            text = "\n".join(b.text for b in call.completed.content if isinstance(b, TextBlock))
            screened = state.screened("tool_output", call.call_id, text)
            if screened:
                out.append(screened)
    return out


class GuardrailsHandler:
    """The reactor around :func:`screen` (identity ``guardrails``)."""

    name = NAME
    concurrency = 32  # runs are checked side by side; the runtime keeps a run's events in order

    def __init__(self, log: EventLog, *, chain: Chain, alerts: AlertSink | None = None) -> None:
        self.log = log
        self.chain = chain
        self.consumes: tuple[type[Event], ...] = consumed(chain)
        self.loader = RunLoader(log)
        self.alerts = alerts

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        if event.run_id is None:
            return []
        state = await self.loader.state(event.run_id)
        out = screen(self.chain, state, event, self.name)
        if self.alerts is not None:
            for e in out:
                if isinstance(e, AlertRaised):
                    self.alerts.send(e, run_id=event.run_id)
        if state.terminal:
            self.loader.forget(event.run_id)
        return out

    async def background(self) -> None:
        """Delivers alerts to the webhook, off the handler's path."""
        if self.alerts is not None:
            await self.alerts.run()
