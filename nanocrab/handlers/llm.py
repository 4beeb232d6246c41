"""The LLM handler: one model call per ``llm.requested``, every attempt on the record.

Consumes ``llm.requested``; rebuilds the conversation from the run's events (plus earlier runs
of its session), calls the provider with streaming, forwards text deltas to the ephemeral stream
and emits ``llm.responded`` (content, stop reason, usage, cost, latency). Failures are typed:
retryable ones are retried with exponential backoff, each failed attempt recorded as
``llm.failed(will_retry=True)``; a context overflow is compacted once (``context.compacted``:
older turns summarised, recent ones kept) and retried; anything else ends in ``llm.failed``,
which the orchestrator turns into ``run.failed``. A request whose turn already has an outcome is
a redelivery and emits nothing.

Failover (``nanocrab/llm/failover.py``): when the run's agent lists ``models``, a retryable
failure that used up its retries (an overload at once) moves the call to the next model, recorded
as ``llm.failed(will_retry=True, model=..., failover_to=...)``; only the last model's failure is
final. A branched session's history comes from the session index (``handlers/branches.py``).

With a ``recall`` (similar-task memory), the first model call of a top-level run that no router
handled looks for earlier episodes like the task and, when some score high enough, appends
``memory.recalled`` before calling the model (its id derived from the request, so a redelivery
stores it once) and lists them in the system prompt: the timeline shows the sources, and no
extra hop is taken, found or not (no embedding at all while memory holds no episode).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_exponential,
)

from nanocrab.agents import ModelChoice, profile
from nanocrab.bus import Delivery, EventLog, stamp
from nanocrab.events import (
    ContextCompacted,
    Event,
    LlmDelta,
    LlmFailed,
    LlmRequested,
    LlmResponded,
    MemoryRecalled,
    TaskSubmitted,
)
from nanocrab.handlers import conversation
from nanocrab.handlers.images import ImageSource
from nanocrab.handlers.orchestrator.decide import needs_route
from nanocrab.handlers.prompt import system_prompt
from nanocrab.handlers.runloader import CAPACITY, RunLoader
from nanocrab.handlers.runstate import RunState
from nanocrab.handlers.workspace import workspace_of
from nanocrab.hooks import Hooks
from nanocrab.llm.base import DeltaSink, LlmError, Message, ModelRequest, ModelResponse, Provider
from nanocrab.llm.failover import FailoverPolicy, label
from nanocrab.pyagent.loader import run_agent
from nanocrab.reload import ConfigView, pinned
from nanocrab.reload.skills import VersionedSkills
from nanocrab.skills import SkillLibrary
from nanocrab.tools.registry import ToolRegistry

if TYPE_CHECKING:  # the guardrails library loads only where guardrails are on
    from nanocrab.handlers.guardrails import Prescreener

class SessionHistory(Protocol):
    """(session_id, current run_id, task sequence, the task's tenant) → the tenant's session's
    messages from before the task, oldest first. Implementations must not answer from anything
    that has not yet seen everything before that sequence, nor from another tenant's session of
    the same id: :class:`~nanocrab.handlers.sessions.SessionIndex` folds the log itself."""

    def __call__(
        self, session_id: str, run_id: str, before_seq: int, *, tenant: str
    ) -> Awaitable[list[Message]]: ...


class Recall(Protocol):
    """A task's text, for the run's tenant → that tenant's earlier episodes for its prompt
    (``None``: nothing close enough): :func:`nanocrab.projections.memory_search.recaller`."""

    def __call__(self, text: str, *, tenant: str) -> Awaitable[MemoryRecalled | None]: ...

_DELTA_FLUSH_CHARS = 200
_EARLY_RECALLS = 256  # recalls started at submission and not yet taken by a first model call
_EARLY_BUSY = 4
"""Early recalls searching at once, above which a submitted task's recall waits for its first
model call: a burst of tasks would otherwise queue hundreds of searches (an embedding each)
ahead of the runs the orchestrator has started, and the first of them would complete last."""
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
    known_runs_first = frozenset({"llm.requested"})
    """A run's later model calls go before the first calls of runs not started here yet: in
    a burst, runs then complete one by one instead of all together at the end."""

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
        routed: bool = False,
        prescreen: Prescreener | None = None,
        max_attempts: int = 4,
        backoff_s: float = 0.5,
        backoff_max_s: float = 20.0,
        providers: Mapping[str, Provider] | None = None,
        failover: FailoverPolicy | None = None,
        agents: ConfigView | None = None,
        images: ImageSource | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        """``agents``: the versioned configuration; a run whose agent is a Python agent there
        (``module:`` in agents.yaml) is the ``pyagent`` handler's, not the model's."""
        self.agents = agents
        self.log = log
        # the bytes of the messages' image blocks (default: the log's object store)
        self.images = images or ImageSource.of_log(log)
        self.hooks = hooks  # before_model extension hooks (nanocrab/hooks)
        self.loader = RunLoader(log)
        self.provider = provider
        self.registry = registry
        self.default_workspace = default_workspace
        self.model = model
        self.skills = skills
        self.history = history
        self.recall = recall
        self.routed = routed  # a router answers tasks naming no agent, and recalls for them
        # run → (task text, its recall started when the task was submitted): the search then
        # overlaps the run's start (guardrails, pinning) instead of delaying the first call
        self._early: OrderedDict[str, tuple[str, asyncio.Task[MemoryRecalled | None]]] = (
            OrderedDict()
        )
        self._early_busy = 0  # early recalls not done yet
        if recall is not None:
            self.consumes = (LlmRequested, TaskSubmitted)
        self.prescreen = prescreen  # tool output the orchestrator did not wait for (guardrails)
        self._histories: dict[str, list[Message]] = {}
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.providers = dict(providers or {})  # by name: failover targets on other providers
        self.failover = failover or FailoverPolicy()

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        if isinstance(event, TaskSubmitted):
            self._recall_early(event)
            return []
        assert isinstance(event, LlmRequested) and event.run_id
        state = await self.loader.state(event.run_id)
        turn = next((t for t in reversed(state.turns) if t.index == event.turn), None)
        if state.task is None or state.terminal or turn is None:
            return []
        if turn.response is not None or turn.failure is not None or turn.refused is not None:
            return []
        if self.agents is not None and state.started is not None:
            started = state.started
            if await run_agent(self.agents, started.agent, started.config) is not None:
                return []  # a Python agent answers this run (handlers/pyagent.py)
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
            if self.hooks:  # extension hooks may change the context; each change is an event
                agent = state.started.agent if state.started is not None else "default"
                request, applied = await self.hooks.before_model(request, agent=agent)
                out.extend(applied)
            request = await self.images.attach(request)
            try:
                out.append(await self._failover(request, event, out, self._fallbacks(state)))
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
        early = self._early.pop(state.run_id, None)
        if task.parent_run_id or state.route is not None or task.text.lstrip().startswith("/"):
            if early is not None:
                early[1].cancel()
            return state
        text = state.screened("task_input", task.id, task.text)
        if early is not None and early[0] != text:
            early[1].cancel()  # the guardrails changed the text: recall on what they let through
            early = None
        if not text:
            return state
        found = (await early[1] if early is not None
                 else await self.recall(text, tenant=task.tenant))  # fmt: skip
        if found is None:
            return state
        (recalled,) = stamp(self.name, event, [found], first=_RECALL_ORDINAL)
        await self.log.append(recalled)
        assert isinstance(recalled, MemoryRecalled)
        return dataclasses.replace(state, recalled=recalled)

    def _recall_early(self, task: TaskSubmitted) -> None:
        """Start the recall of a top-level task as it is submitted (its first model call awaits
        it, on the same text; a recall never raises: it answers ``None`` on failure)."""
        if self.recall is None or task.parent_run_id or not task.run_id:
            return
        if task.text.lstrip().startswith("/") or task.run_id in self._early:
            return
        if self.routed and needs_route(task):
            return  # the router recalls for it, before route.decided
        if self._early_busy >= _EARLY_BUSY:
            return
        self._early_busy += 1
        search = asyncio.ensure_future(self.recall(task.text, tenant=task.tenant))
        search.add_done_callback(self._early_done)
        self._early[task.run_id] = (task.text, search)
        while len(self._early) > _EARLY_RECALLS:
            self._early.popitem(last=False)[1][1].cancel()  # a run that never asked the model

    def _early_done(self, _: asyncio.Future[MemoryRecalled | None]) -> None:
        self._early_busy -= 1

    async def _history(self, state: RunState) -> list[Message]:
        """The session's messages stored before the task, fetched once per run (they cannot
        change under it)."""
        task = state.task
        if self.history is None or task is None or not task.session_id or task.parent_run_id:
            return []
        cached = self._histories.get(state.run_id)
        if cached is None:
            cached = await self.history(
                task.session_id, state.run_id, state.task_seq, tenant=task.tenant
            )
            self._histories[state.run_id] = cached
            while len(self._histories) > CAPACITY:  # runs in flight; older ones re-fetch
                self._histories.pop(next(iter(self._histories)))
        return cached

    async def _failover(
        self,
        request: ModelRequest,
        event: LlmRequested,
        out: list[Event],
        fallbacks: Sequence[ModelChoice],
    ) -> Event:
        """The call on the run's model, then on each of the agent's failover models while the
        policy says a failure moves on (``llm/failover.py``); each move is an ``llm.failed``
        naming the model that failed and the target. Raises the last model's error."""
        chain: list[tuple[Provider, ModelRequest, str]] = [
            (self.provider, request, request.model or self.provider.name)
        ]
        for choice in fallbacks:
            target = self._provider(choice.provider)
            own = target is self.provider
            name = label(None if own else choice.provider, choice.model)
            if all(n != name for _, _, n in chain):
                chain.append((target, msgspec.structs.replace(request, model=choice.model), name))
        for i, (provider, req, name) in enumerate(chain):
            following = chain[i + 1][2] if i + 1 < len(chain) else ""
            try:
                return await self._call(req, event, out, provider=provider, name=name,
                                        moving=bool(following))  # fmt: skip
            except LlmError as exc:
                if not following or not self.failover.moves(exc):
                    raise
                tried = sum(isinstance(e, LlmFailed) and e.model == name for e in out)
                out.append(
                    LlmFailed(
                        kind=exc.kind,
                        message=exc.message,
                        status_code=exc.status_code,
                        attempts=tried + 1,
                        turn=event.turn,
                        will_retry=True,
                        model=name,
                        failover_to=following,
                    )
                )
        raise AssertionError("unreachable: the last model's error is raised")

    def _provider(self, name: str | None) -> Provider:
        if name is None or name == self.provider.name:
            return self.provider
        found = self.providers.get(name)
        if found is None:
            return _Missing(name, sorted({self.provider.name, *self.providers}))
        return found

    def _fallbacks(self, state: RunState) -> tuple[ModelChoice, ...]:
        """The run's agent's failover models (agents.yaml ``models``), as its pinned
        configuration says."""
        if state.started is None:
            return ()
        with pinned(state.started.config):
            return profile(state.started.agent, state.started.config).models

    async def _call(
        self,
        request: ModelRequest,
        event: LlmRequested,
        out: list[Event],
        *,
        provider: Provider,
        name: str,
        moving: bool = False,
    ) -> Event:
        """One model, retried with backoff on retryable errors; ``moving``: another model is
        left, so an error the policy moves on at once is not retried here."""
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
                        model=name,
                    )
                )

        backoff = wait_exponential(multiplier=self.backoff_s, max=self.backoff_max_s)

        def wait(state: RetryCallState) -> float:
            """Exponential backoff, but never sooner than the provider's ``retry-after``."""
            exc = state.outcome.exception() if state.outcome else None
            after = getattr(exc, "retry_after", None) or 0.0
            return max(backoff(state), min(after, self.backoff_max_s))

        def stop(state: RetryCallState) -> bool:
            """After ``max_attempts``, or at once for an error the policy moves on at once."""
            exc = state.outcome.exception() if state.outcome else None
            at_once = moving and isinstance(exc, LlmError) and self.failover.at_once(exc)
            return at_once or state.attempt_number >= self.max_attempts

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retryable),
            stop=stop,
            wait=wait,
            before_sleep=record,
            reraise=True,
        ):
            with attempt:
                started = time.perf_counter()
                response = await provider.complete(request, on_delta=deltas.add)
                await deltas.flush()
        return LlmResponded(
            provider=provider.name,
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
                config=state.config,
            )
            # the run's agent's model (agents.yaml ``model``), else the handler's default
            agent_model = profile(agent, state.config).model if agent is not None else None
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


class _Missing:
    """A failover target naming a provider this handler was not given: the move fails the run
    with a message that says what to fix."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        raise LlmError(
            "fatal",
            f"failover model {request.model!r} names provider {self.name!r}, which this LLM "
            f"handler does not have (it has: {', '.join(self.known)}) — fix agents.yaml `models`",
        )
