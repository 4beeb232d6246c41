"""The LLM handler: one model call per ``llm.requested``, every attempt on the record.

Consumes ``llm.requested``; rebuilds the conversation from the run's events (plus earlier runs
of its session), calls the provider with streaming, forwards text deltas to the ephemeral stream
and emits ``llm.responded`` (content, stop reason, usage, cost, latency). Failures are typed:
retryable ones are retried with exponential backoff, each failed attempt recorded as
``llm.failed(will_retry=True)``; a context overflow is compacted once (``context.compacted``:
older turns summarised, recent ones kept) and retried; anything else ends in ``llm.failed``,
which the orchestrator turns into ``run.failed``. A request whose turn already has an outcome is
a redelivery and emits nothing.

With a ``recall`` (similar-task memory), the first model call of a top-level run that no router
handled looks for earlier episodes like the task and, when some score high enough, appends
``memory.recalled`` before calling the model (its id derived from the request, so a redelivery
stores it once) and lists them in the system prompt: the timeline shows the sources, and no
extra hop is taken, found or not (no embedding at all while memory holds no episode).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from nanocrab.agents import profile
from nanocrab.bus import Delivery, EventLog, stamp
from nanocrab.events import (
    ContextCompacted,
    Event,
    LlmDelta,
    LlmFailed,
    LlmRequested,
    LlmResponded,
    MemoryRecalled,
)
from nanocrab.handlers import conversation
from nanocrab.handlers.prompt import system_prompt
from nanocrab.handlers.runloader import CAPACITY, RunLoader
from nanocrab.handlers.runstate import RunState
from nanocrab.handlers.workspace import workspace_of
from nanocrab.llm.base import LlmError, Message, ModelRequest, Provider
from nanocrab.reload import pinned
from nanocrab.reload.skills import VersionedSkills
from nanocrab.skills import SkillLibrary
from nanocrab.tools.registry import ToolRegistry

if TYPE_CHECKING:  # the guardrails library loads only where guardrails are on
    from nanocrab.handlers.guardrails import Prescreener

SessionHistory = Callable[[str, str, int], Awaitable[list[Message]]]
"""(session_id, current run_id, task sequence) → the session's messages from before the task,
oldest first. Implementations must not answer from anything that has not yet seen everything
before that sequence: :class:`~nanocrab.handlers.sessions.SessionIndex` folds the log itself."""

Recall = Callable[[str], Awaitable[MemoryRecalled | None]]
"""A task's text → earlier episodes for its prompt (``None``: nothing close enough):
:func:`nanocrab.projections.memory_search.recaller`."""

_DELTA_FLUSH_CHARS = 200
_RECALL_ORDINAL = 900_000  # appended before the reaction, outside its ordinals
_DELTA_ORDINAL = 1_000_000  # deltas are stamped outside the reaction ordinals


def _estimate_tokens(request: ModelRequest) -> int:
    """About four characters a token: enough to show what a compaction saved."""
    return len(msgspec.json.encode(request.messages)) // 4


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, LlmError) and exc.kind == "retryable"


class LlmHandler:
    name = "llm"
    consumes: tuple[type[Event], ...] = (LlmRequested,)
    concurrency = 32  # model calls are slow; many runs wait on them at once

    def __init__(
        self,
        log: EventLog,
        *,
        provider: Provider,
        registry: ToolRegistry,
        default_workspace: Path,
        model: str = "",
        skills: SkillLibrary | None = None,
        history: SessionHistory | None = None,
        recall: Recall | None = None,
        prescreen: Prescreener | None = None,
        max_attempts: int = 4,
        backoff_s: float = 0.5,
        backoff_max_s: float = 20.0,
    ) -> None:
        self.log = log
        self.loader = RunLoader(log)
        self.provider = provider
        self.registry = registry
        self.default_workspace = default_workspace
        self.model = model
        self.skills = skills
        self.history = history
        self.recall = recall
        self.prescreen = prescreen  # tool output the orchestrator did not wait for (guardrails)
        self._histories: dict[str, list[Message]] = {}
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        assert isinstance(event, LlmRequested) and event.run_id
        state = await self.loader.state(event.run_id)
        turn = next((t for t in reversed(state.turns) if t.index == event.turn), None)
        if state.task is None or state.terminal or turn is None:
            return []
        if turn.response is not None or turn.failure is not None:
            return []
        if self.prescreen is not None:
            self.prescreen.outputs(state)
        if self.recall is not None and turn is state.turns[0] and state.recalled is None:
            state = await self._recall(state, event)
        history = await self._history(state)
        if isinstance(self.skills, VersionedSkills) and state.started is not None:
            await self.skills.view.ensure(state.started.config)  # the run's pinned version
        out: list[Event] = []
        compacted = False
        while True:
            request = self._request(state, event, history)
            try:
                out.append(await self._call(request, event, out))
                return out
            except LlmError as exc:
                if exc.kind == "overflow" and not compacted:
                    compaction = self._compact(state)
                    if compaction is not None:
                        before = _estimate_tokens(request)
                        state = dataclasses.replace(state, compaction=compaction)
                        after = _estimate_tokens(self._request(state, event, history))
                        out.append(
                            msgspec.structs.replace(
                                compaction, tokens_before=before, tokens_after=after
                            )
                        )
                        compacted = True
                        continue
                out.append(
                    LlmFailed(
                        kind=exc.kind,
                        message=exc.message,
                        status_code=exc.status_code,
                        attempts=sum(isinstance(e, LlmFailed) for e in out) + 1,
                        turn=event.turn,
                    )
                )
                return out

    async def _recall(self, state: RunState, event: LlmRequested) -> RunState:
        """Similar earlier work for a top-level task no router has handled (a router recalls
        itself, before ``route.decided``), on the text the guardrails let through."""
        task = state.task
        assert task is not None and self.recall is not None
        if task.parent_run_id or state.route is not None or task.text.lstrip().startswith("/"):
            return state
        text = state.screened("task_input", task.id, task.text)
        if not text:
            return state
        found = await self.recall(text)
        if found is None:
            return state
        (recalled,) = stamp(self.name, event, [found], first=_RECALL_ORDINAL)
        await self.log.append(recalled)
        assert isinstance(recalled, MemoryRecalled)
        return dataclasses.replace(state, recalled=recalled)

    async def _history(self, state: RunState) -> list[Message]:
        """The session's messages stored before the task, fetched once per run (they cannot
        change under it)."""
        task = state.task
        if self.history is None or task is None or not task.session_id or task.parent_run_id:
            return []
        cached = self._histories.get(state.run_id)
        if cached is None:
            cached = await self.history(task.session_id, state.run_id, state.task_seq)
            self._histories[state.run_id] = cached
            while len(self._histories) > CAPACITY:  # runs in flight; older ones re-fetch
                self._histories.pop(next(iter(self._histories)))
        return cached

    async def _call(self, request: ModelRequest, event: LlmRequested, out: list[Event]) -> Event:
        deltas = _Deltas(self.log, event)

        def record(attempt: RetryCallState) -> None:
            exc = attempt.outcome.exception() if attempt.outcome else None
            if isinstance(exc, LlmError):
                out.append(
                    LlmFailed(
                        kind=exc.kind,
                        message=exc.message,
                        status_code=exc.status_code,
                        attempts=attempt.attempt_number,
                        turn=event.turn,
                        will_retry=True,
                    )
                )

        backoff = wait_exponential(multiplier=self.backoff_s, max=self.backoff_max_s)

        def wait(state: RetryCallState) -> float:
            """Exponential backoff, but never sooner than the provider's ``retry-after``."""
            exc = state.outcome.exception() if state.outcome else None
            after = getattr(exc, "retry_after", None) or 0.0
            return max(backoff(state), min(after, self.backoff_max_s))

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retryable),
            stop=stop_after_attempt(self.max_attempts),
            wait=wait,
            before_sleep=record,
            reraise=True,
        ):
            with attempt:
                started = time.perf_counter()
                response = await self.provider.complete(request, on_delta=deltas.add)
                await deltas.flush()
        return LlmResponded(
            provider=self.provider.name,
            model=response.model or request.model,
            content=list(response.content),
            stop_reason=response.stop_reason,
            usage=response.usage,
            cost_usd=response.cost_usd,
            latency_ms=(time.perf_counter() - started) * 1000,
            turn=event.turn,
        )

    def _request(
        self, state: RunState, event: LlmRequested, history: list[Message]
    ) -> ModelRequest:
        assert state.task is not None
        known = set(self.registry.names())
        tools = [t for t in event.tools if t in known]
        agent = state.started.agent if state.started is not None else None
        with pinned(state.started.config if state.started is not None else ""):
            system = system_prompt(
                state.task,
                tools=tools,
                workspace=workspace_of(state.task, self.default_workspace),
                registry=self.registry,
                skills=self.skills,
                agent=agent,
                recalled=state.recalled,
            )
            # the run's agent's model (agents.yaml ``model``), else the handler's default
            agent_model = profile(agent).model if agent is not None else None
        return ModelRequest(
            system=system,
            messages=conversation.messages(state, history),
            tools=self.registry.specs(tools),
            model=event.model or agent_model or self.model,
            run_id=state.run_id,
            turn=event.turn,
            # as the guardrails let it through (a blocked task never reaches the model)
            task=state.screened("task_input", state.task.id, state.task.text) or "",
        )

    @staticmethod
    def _compact(state: RunState) -> ContextCompacted | None:
        answered = [t for t in state.turns if t.response is not None]
        already = state.compaction.turns_summarised if state.compaction else 0
        cut = len(answered) - conversation.KEEP_TURNS
        if cut <= already:
            return None
        summary = conversation.summarise_turns(answered[:cut], state=state)
        if state.compaction is not None:
            more = conversation.summarise_turns(answered[already:cut], state=state)
            summary = f"{state.compaction.summary}\n{more}"
        upto = answered[cut - 1].response
        return ContextCompacted(
            summary=summary, turns_summarised=cut, upto_event_id=upto.id if upto else ""
        )


class _Deltas:
    """Coalesces streamed text into a few ``llm.delta`` events (best effort, never awaited)."""

    def __init__(self, log: EventLog, event: LlmRequested) -> None:
        self.log = log
        self.event = event
        self.buffer: list[str] = []
        self.size = 0
        self.index = 0

    async def add(self, text: str) -> None:
        self.buffer.append(text)
        self.size += len(text)
        if self.size >= _DELTA_FLUSH_CHARS:
            await self.flush()

    async def flush(self) -> None:
        if not self.buffer:
            return
        text, self.buffer, self.size = "".join(self.buffer), [], 0
        delta = LlmDelta(index=self.index, text=text)
        await self.log.append_nowait(
            stamp("llm", self.event, [delta], first=_DELTA_ORDINAL + self.index)[0]
        )
        self.index += 1
