"""The guardrails handler: runs the ``guardrails.yaml`` chain at a run's checkpoints and records
each verdict as ``guardrail.checked`` (plus ``alert.raised`` for filters that ask for one).

Consumes, for the checkpoints the chain has a filter for (none: the type is not consumed, no hop):

- ``task_input``: the task on ``run.started`` and ``message.queued`` (subject: their event id);
- ``tool_output``: ``tool.completed`` (subject: the call id), before the model reads it;
- ``tool_call``: ``llm.responded`` — each ``tool_use`` block (subject: the call id; the text
  checked is the arguments as JSON, the structured call goes to the alignment detector), before
  the orchestrator asks the policy;
- ``reply``: ``llm.responded`` without tool calls (subject: the response's event id), before
  ``reply.sent``.

The orchestrator waits for these verdicts only where ``run.started.guarded`` says so, and acts on
them (``handlers/orchestrator/decide.py``); the model's context is built from the verdict's text
(``handlers/conversation.py``). A run that did not pin a checkpoint is not checked there.

The task is checked once its run has started, not as ``task.submitted`` arrives: checked side
by side with the orchestrator's start, its verdict landed while the start was being decided and
superseded it on almost every run (the run then started only on the verdict's delivery, +3 to +5 ms
end to end). A task the orchestrator pre-screened clean starts with its first model call and is
judged after the fact; any other waits for the verdict either way.

The core, :func:`screen`, is a function of the chain, the run's state and the event; the reactor
only loads the state and hands alerts to the optional webhook. Redelivery is harmless: a subject
already judged in the state is skipped, and reaction ids derive from the cause. A detector that
raises fails closed: the verdict is ``block`` with the error named (never the text).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from nanocrab.bus import Delivery, EventLog
from nanocrab.events import (
    AgentResponded,
    AlertRaised,
    Event,
    GuardrailChecked,
    GuardrailCheckpoint,
    GuardrailFinding,
    LlmResponded,
    MessageQueued,
    RunStarted,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolResolved,
    ToolUseBlock,
    derive_event_id,
)
from nanocrab.guardrails import (
    CheckContext,
    GuardrailsConfig,
    Judgement,
    ToolCallView,
    Verdict,
    check,
    prescreen,
)
from nanocrab.guardrails.config import AlignmentFilter
from nanocrab.handlers.alerts import AlertSink
from nanocrab.handlers.conversation import text_of
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.runstate import RunState, passed_untouched
from nanocrab.reload import ConfigView

if TYPE_CHECKING:  # the anthropic SDK is imported only where a key is set (cli/wiring.py)
    from nanocrab.guardrails.alignment_llm import ClaudeAlignmentJudge

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
        types += [RunStarted, MessageQueued]
    if "tool_output" in guarded:
        types += [ToolCompleted, ToolResolved]  # a subagent's answer is tool output too
    if guarded & {"tool_call", "reply"}:
        types += [LlmResponded, AgentResponded]  # a Python agent's calls and replies too
    return tuple(types)


def screen(chain: Chain, state: RunState, event: Event, source: str = NAME,
           judgements: Mapping[str, Judgement] | None = None,
           clean: Callable[[str, str], bool] | None = None) -> list[Event]:  # fmt: skip
    """The verdicts (and alerts) on what ``event`` brings into the run, given the run's
    ``state`` (folded at least up to ``event``). ``source`` names the handler in event ids;
    ``judgements``: the model-based alignment check's answers by tool call id; ``clean``:
    whether this process already found ``(checkpoint, subject id)`` clean under ``chain``
    (:class:`Prescreener`) — its verdict is then the ``allow`` the chain would give, built
    without running the detectors again."""
    task = state.task
    if task is None:
        return []
    jobs = _jobs(chain, state, event)
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
            judgement=(judgements or {}).get(subject_id) if call is not None else None,
        )  # fmt: skip
        known = clean is not None and clean(checkpoint, subject_id)
        checked = _checked(chain, checkpoint, subject_id, text, context, known_clean=known)
        placeholders.update(checked.placeholders_added)
        verdict_id = derive_event_id(source, event.id, len(out))
        out.append(checked)
        out += _alerts(checked, verdict_id)
    return out


_Job = tuple[GuardrailCheckpoint, str, str, str | None, ToolCallView | None]
"""(checkpoint, subject id, text, tool, the structured call at ``tool_call``)."""


def _jobs(chain: Chain, state: RunState, event: Event) -> list[_Job]:
    """What ``event`` brings into the run that the run's guarded checkpoints screen."""
    task = state.task
    assert task is not None
    jobs: list[_Job] = []
    match event:
        case TaskSubmitted():  # the orchestrator's pre-screen: the start decides whether to wait
            if event.id == task.id and not task.text.strip().startswith("/"):
                jobs.append(("task_input", event.id, task.text, None, None))
        case RunStarted():  # the handler's check (see the module docstring)
            if state.guarded("task_input") and not task.text.strip().startswith("/"):
                jobs.append(("task_input", task.id, task.text, None, None))
        case MessageQueued():
            # before run.started the pinning is not known yet: the chain decides (as it will)
            early = state.started is None and "task_input" in chain.guarded()
            if state.guarded("task_input") or early:
                jobs.append(("task_input", event.id, event.text, None, None))
        case ToolCompleted():
            blocked = state.verdict("tool_call", event.call_id)
            call = state.call(event.call_id)
            # a call the guardrails refused has no output to check (its result is their own);
            # nor has a result the run does not believe (a tool.resolved for a call the
            # executor runs): its verdict would stand for the real one
            done = call.completed if call is not None else None
            believed = done is not None and done.id == event.id
            if state.guarded("tool_output") and believed and (
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
    return jobs


def _checked(chain: Chain, checkpoint: GuardrailCheckpoint, subject_id: str, text: str,
             context: CheckContext, *, known_clean: bool = False) -> GuardrailChecked:  # fmt: skip
    started = time.perf_counter()
    error: str | None = None
    try:
        if known_clean:  # what check() returns when nothing fires: every applicable filter ran
            ran = tuple(f.id for f in chain.config.filters if f.applies(checkpoint, context))
            verdict = Verdict(checkpoint=checkpoint, action="allow", text=text, filters_run=ran,
                              placeholders=context.placeholders)  # fmt: skip
        else:
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
    blocker = checked.fired[-1] if checked.fired else None  # a block stops the chain
    if checked.action == "block" and checked.error is None and blocker not in checked.alerts:
        # every block is an alert, asked for by its filter or not (docs/observability.md)
        out.append(
            AlertRaised(
                severity="critical", origin="guardrail", filter_id=blocker or "",
                checkpoint=checked.checkpoint, action="block",
                labels=sorted({f.label for f in checked.findings if f.filter_id == blocker}),
                summary=f"guardrail {blocker!r} blocked at {checked.checkpoint}"
                + (f" ({checked.tool})" if checked.tool else "")
                + (f": {checked.reason}" if checked.reason else ""),
                verdict_event_id=verdict_id, tool=checked.tool,
            )
        )  # fmt: skip
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


MEMO = 4096
"""Clean answers a :class:`Prescreener` remembers (a cache: a miss only costs a check)."""

PRESCREEN_MAX = 2048
"""Longest text pre-screened (characters): beyond it the heuristics cost about what the hop
they would save does (~2 ms), so the run waits for the handler's verdict instead."""


class Prescreener:
    """Pre-screens, in the process that acts next, what the guardrails handler is about to
    judge, so a run need not wait for a verdict the chain can only give as ``allow``.

    The orchestrator asks :meth:`event` before deciding on an event; the LLM handler asks
    :meth:`outputs` before building the model's context. A subject pre-screened clean
    (:func:`nanocrab.guardrails.prescreen`: no filter fires with the fast detector layers and
    no slow layer would have been consulted) goes into ``state.prescreened``; the run moves on,
    and the handler's verdict — the same chain on the same text, so an ``allow`` with no
    finding — is recorded after the fact. Anything else (a finding, a text the classifier or
    the model-based check would read, a text over :data:`PRESCREEN_MAX`, a run pinned to a
    configuration version this process has not loaded) waits for the verdict as before, so
    the model never reads a text the chain would not pass as is.
    """

    def __init__(self, chain: Chain, *, config: ConfigView | None = None,
                 max_chars: int = PRESCREEN_MAX) -> None:  # fmt: skip
        self.chain = chain
        self.config = config
        self.max_chars = max_chars
        self._chains: dict[str, Chain] = {}
        # (chain digest, run, checkpoint, subject) found clean in this process, by a pre-screen
        # or by the handler's full check: whichever of them comes second reuses the answer
        self._clean: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()

    def known_clean(self, chain: Chain, run_id: str, checkpoint: str, subject_id: str) -> bool:
        """Whether ``subject_id`` at ``checkpoint`` of ``run_id`` was found clean under
        ``chain`` in this process (a pre-screen, or a full check that allowed it untouched)."""
        return (chain.sha256, run_id, checkpoint, subject_id) in self._clean

    def remember_clean(self, chain: Chain, run_id: str, checkpoint: str, subject_id: str) -> None:
        """Record a clean answer (the newest :data:`MEMO` are kept)."""
        self._clean[(chain.sha256, run_id, checkpoint, subject_id)] = None
        while len(self._clean) > MEMO:
            self._clean.popitem(last=False)

    def _chain(self, state: RunState) -> Chain | None:
        """The run's chain, when this process has it at hand (``None``: do not pre-screen)."""
        if self.config is None:
            return self.chain
        version = state.started.config if state.started is not None else None
        if version is None:  # not started: the version is pinned by this very decision
            return self.chain if not self.config.switches else None
        if not version:
            return self.chain
        if version not in self._chains:
            loaded = self.config.versions.get(version)
            if loaded is None or loaded.guardrails is None:
                return None
            self._chains[version] = Chain.of(loaded.guardrails, loaded.guardrails_text)
        return self._chains[version]

    def event(self, state: RunState, event: Event) -> None:
        """Pre-screen what ``event`` brings into the run (``state`` folded up to it)."""
        chain = self._chain(state) if state.task is not None else None
        if chain is None:
            return
        jobs = [j for j in _jobs(chain, state, event) if state.verdict(j[0], j[1]) is None
                and (j[0], j[1]) not in state.prescreened]  # fmt: skip
        if jobs:
            self._screen(chain, state, jobs)

    def outputs(self, state: RunState) -> None:
        """Pre-screen the run's tool outputs that have no ``tool_output`` verdict yet."""
        chain = self._chain(state) if state.task is not None else None
        if chain is None or not state.guarded("tool_output"):
            return
        jobs: list[_Job] = []
        for turn in state.turns:
            for call in turn.calls:
                done = call.completed
                if done is None or state.verdict("tool_output", call.call_id) is not None:
                    continue
                if ("tool_output", call.call_id) in state.prescreened:
                    continue
                text = "\n".join(b.text for b in done.content if isinstance(b, TextBlock))
                jobs.append(("tool_output", call.call_id, text, done.tool, None))
        if jobs:
            self._screen(chain, state, jobs)

    def _screen(self, chain: Chain, state: RunState, jobs: list[_Job]) -> None:
        task = state.task
        assert task is not None
        task_text = state.screened("task_input", task.id, task.text) or ""
        untrusted = tuple(_outputs(state)) if any(j[0] == "tool_call" for j in jobs) else ()
        for checkpoint, subject_id, text, tool, call in jobs:
            if self.known_clean(chain, state.run_id, checkpoint, subject_id):
                state.prescreened.add((checkpoint, subject_id))
                continue
            if len(text) > self.max_chars:
                continue
            context = CheckContext(
                tool=tool, agent=task.agent, task=task_text, untrusted=untrusted, tool_call=call,
                placeholders=state.placeholders, salt=state.run_id,
            )  # fmt: skip
            try:
                clean = prescreen(chain.config, checkpoint, text, context)
            except Exception:  # a detector that raises: the handler's verdict decides
                clean = False
            if clean:
                state.prescreened.add((checkpoint, subject_id))
                self.remember_clean(chain, state.run_id, checkpoint, subject_id)


class GuardrailsHandler:
    """The reactor around :func:`screen` (identity ``guardrails``)."""

    name = NAME
    concurrency = 32  # runs are checked side by side; the runtime keeps a run's events in order

    def __init__(
        self,
        log: EventLog,
        *,
        chain: Chain,
        alerts: AlertSink | None = None,
        config: ConfigView | None = None,
        judge: ClaudeAlignmentJudge | None = None,
        prescreen: Prescreener | None = None,
    ) -> None:
        """``config``: the versioned configuration; a run is screened by the chain of the
        version it is pinned to (``run.started.config``). The checkpoints consumed stay those
        of ``chain`` (a version adding a checkpoint needs a restart, docs/reload.md).
        ``judge``: the model-based alignment check (set when an Anthropic key is).
        ``prescreen``: the process's :class:`Prescreener` — a subject it found clean is not
        checked again, and a clean verdict here spares it a pre-screen."""
        self.log = log
        self.chain = chain
        self.judge = judge
        self.prescreen = prescreen
        self.config = config
        self._chains: dict[str, Chain] = {}
        self.consumes: tuple[type[Event], ...] = consumed(chain)
        self.loader = RunLoader(log)
        self.alerts = alerts

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        if event.run_id is None:
            return []
        state = await self.loader.state(event.run_id)
        chain = await self._chain(state)
        judgements = await self._judge(chain, state, event)
        memo = self.prescreen
        run_id = event.run_id
        clean = partial(memo.known_clean, chain, run_id) if memo is not None else None
        out = screen(chain, state, event, self.name, judgements, clean)
        if memo is not None:
            for e in out:
                if isinstance(e, GuardrailChecked) and passed_untouched(e):
                    memo.remember_clean(chain, run_id, e.checkpoint, e.target_id)
        if self.alerts is not None:
            for e in out:
                if isinstance(e, AlertRaised):
                    self.alerts.send(e, run_id=event.run_id)
        if state.terminal:
            self.loader.forget(event.run_id)
        return out

    async def _chain(self, state: RunState) -> Chain:
        """The chain of the run's pinned version (``chain`` without a versioned config)."""
        if self.config is None or state.started is None or not state.started.config:
            return self.chain
        version = state.started.config
        if version not in self._chains:
            loaded = await self.config.ensure(version)
            self._chains[version] = (
                Chain.of(loaded.guardrails, loaded.guardrails_text)
                if loaded.guardrails is not None
                else self.chain
            )
        return self._chains[version]

    async def _judge(self, chain: Chain, state: RunState,
                     event: Event) -> dict[str, Judgement] | None:  # fmt: skip
        """The model-based alignment check on ``event``'s tool calls, when a judge is set, an
        alignment filter asks for it, the run guards ``tool_call``, the model has read tool
        output since the task (no untrusted input, nothing to be hijacked by) and the call has
        no verdict yet (a redelivery does not ask again). Calls are judged side by side; an
        API failure comes back as a judgement with ``error`` (never raises)."""
        if self.judge is None or not isinstance(event, LlmResponded) or state.task is None:
            return None
        if not state.guarded("tool_call") or not any(
            isinstance(f, AlignmentFilter) and f.wants_judge for f in chain.config.filters
        ):
            return None
        uses = [b for b in event.content if isinstance(b, ToolUseBlock)
                if state.verdict("tool_call", b.id) is None]  # fmt: skip
        untrusted = _outputs(state)
        if not uses or not untrusted:
            return None
        task = state.screened("task_input", state.task.id, state.task.text) or ""
        answers = await asyncio.gather(
            *(self.judge.judge(task, untrusted, b.name, b.input) for b in uses)
        )
        return {b.id: a for b, a in zip(uses, answers, strict=True)}

    async def background(self) -> None:
        """Delivers alerts to the webhook, off the handler's path."""
        if self.alerts is not None:
            await self.alerts.run()
