"""The Python agent host: plays the model's part of the runs of agents declared with
``module:`` in ``agents.yaml`` (docs/agents.md).

Identity ``pyagent``. Consumes ``llm.requested``; for a run whose agent (in the configuration
version the run is pinned to) is a Python agent it answers the turn as a model would:

* the agent awaits tool calls → ``llm.responded`` (``stop_reason: tool_use``) holding one
  ``tool_use`` block per call. The orchestrator then requests each call, the policy grants or
  denies it, the executor runs it — the agent holds no power of its own. The next
  ``llm.requested`` comes once every call has a result: the results are handed to the waiting
  agent (as the model would read them, guardrails applied) and it goes on;
* the agent returns a ``Response`` → ``llm.responded`` (``end_turn``) with its text, which the
  orchestrator turns into ``reply.sent`` + ``run.completed``;
* the agent raises, returns something else, or neither answers nor calls a tool within its
  profile's ``timeout_s`` → ``llm.failed{kind: agent}`` → ``run.failed{kind: agent}``. The
  agent's failure is the run's, never the handler's.

Its ``context.log`` lines and ``emit_metric`` measurements go out with the answer as
``agent.logged`` / ``agent.metric``. In the background, each Python agent of the active version
is asked ``on_health_check`` every ``health_every_s``; changes are recorded as ``agent.health``.

A run's agent is kept running between turns in this process (a :class:`Session`); a turn
arriving where no session waits (a restart, another instance, an evicted session) starts the
agent again from the beginning and answers the calls it made before from the log, in order.
A redelivered ``llm.requested`` whose turn already has an answer emits nothing. The LLM handler
skips these runs (``handlers/llm.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence

from nanocrab.agents import profile
from nanocrab.bus import Delivery, EventLog
from nanocrab.events import (
    AgentHealth,
    AgentLogged,
    AgentResponded,
    Event,
    LlmFailed,
    LlmRequested,
    RunCancelled,
    RunCompleted,
    RunFailed,
    TextBlock,
    ToolUseBlock,
    Usage,
)
from nanocrab.handlers.conversation import result_block, text_of
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.runstate import CallState, RunState
from nanocrab.pyagent.api import Health, Request, ToolResult
from nanocrab.pyagent.code import AgentLoadError, load
from nanocrab.pyagent.loader import PythonAgent, python_agent, run_agent
from nanocrab.pyagent.session import Calls, Crashed, Finished, Gone, Known, Session
from nanocrab.reload import ConfigView

log = logging.getLogger(__name__)

NAME = "pyagent"
PROVIDER = "python"
SESSIONS = 256
"""Runs whose agent is kept running between turns; an evicted one is resumed by replay."""
HEALTH_TIMEOUT_S = 10.0


def tool_result(call: CallState, state: RunState) -> ToolResult:
    """What the agent gets for ``call``: the block a model would read, with its flags."""
    block = result_block(call, state)
    text = text_of([b for b in block.content if isinstance(b, TextBlock)])
    completed = call.completed
    kind = completed.error_kind if completed is not None else None
    denied = call.denied is not None or kind == "denied"
    return ToolResult(
        tool=call.tool, call_id=call.call_id, text=text, is_error=block.is_error,
        denied=denied, skipped=call.skipped is not None,
        error_kind="denied" if denied else kind,
    )  # fmt: skip


class PyAgentHandler:
    name = NAME
    consumes: tuple[type[Event], ...] = (LlmRequested, RunCompleted, RunFailed, RunCancelled)
    concurrency = 32  # a turn waits on the agent's own work, as a model call would

    def __init__(
        self, log_: EventLog, *, view: ConfigView, health_every_s: float | None = 60.0
    ) -> None:
        """``view``: the versioned configuration (which agents are Python agents, and their
        code, per version). ``health_every_s``: how often ``on_health_check`` runs (``None``:
        never)."""
        self.log = log_
        self.view = view
        self.loader = RunLoader(log_)
        self.health_every_s = health_every_s
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.health: dict[tuple[str, str], bool] = {}

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event]:
        if isinstance(event, RunCompleted | RunFailed | RunCancelled):
            if event.run_id is not None:
                self.loader.forget(event.run_id)
                if s := self.sessions.pop(event.run_id, None):
                    s.cancel()
            return []
        assert isinstance(event, LlmRequested) and event.run_id
        state = await self.loader.state(event.run_id)
        turn = next((t for t in reversed(state.turns) if t.index == event.turn), None)
        if state.task is None or state.started is None or state.terminal or turn is None:
            return []
        if turn.response is not None or turn.failure is not None:
            return []  # answered (a redelivery)
        agent = await run_agent(self.view, state.started.agent, state.started.config)
        if agent is None:
            return []  # a model-driven run: the LLM handler's
        session = await self._session(state, event, agent)
        if isinstance(session, LlmFailed):
            return [session]
        run_id = event.run_id

        async def ended() -> bool:  # a cancel waits behind this turn: look for it meanwhile
            return (await self.loader.state(run_id)).terminal

        timeout = profile(agent.spec.name, state.started.config).timeout_s
        outcome = await session.next(event.turn, timeout, ended=ended)
        if isinstance(outcome, Gone):
            self.sessions.pop(run_id, None)
            return []
        events: list[Event] = [*session.take_events()]
        model = f"{agent.spec.name}@{agent.version[:12] or 'startup'}"
        if isinstance(outcome, Calls):
            blocks = [ToolUseBlock(id=c.call_id, name=c.tool, input=c.arguments)
                      for c in outcome.calls]  # fmt: skip
            events.append(AgentResponded(provider=PROVIDER, model=model, content=list(blocks),
                                       stop_reason="tool_use", turn=event.turn,
                                       usage=Usage()))  # fmt: skip
            return events
        self.sessions.pop(event.run_id, None)
        if isinstance(outcome, Finished):
            text = outcome.response.text
            events.append(AgentResponded(provider=PROVIDER, model=model,
                                       content=[TextBlock(text)], stop_reason="end_turn",
                                       turn=event.turn, usage=Usage()))  # fmt: skip
            return events
        assert isinstance(outcome, Crashed)
        log.warning("pyagent: run %s: agent %s failed: %s", event.run_id, agent.spec.name,
                    outcome.message)  # fmt: skip
        if outcome.trace:
            events.append(AgentLogged(agent=agent.spec.name, message=outcome.trace,
                                      level="error", turn=event.turn))  # fmt: skip
        events.append(LlmFailed(kind="agent", message=outcome.message, turn=event.turn))
        return events

    async def _session(
        self, state: RunState, event: LlmRequested, agent: PythonAgent
    ) -> Session | LlmFailed:
        """The run's live session, given the results of its last turn; or a new one, replaying
        the calls of the turns before this one."""
        assert event.run_id is not None and state.task is not None and state.started is not None
        live = self.sessions.get(event.run_id)
        if live is not None and live.turn == event.turn - 1 and not live.pending:
            previous = next((t for t in state.turns if t.index == event.turn - 1), None)
            if previous is not None:
                live.resolve({c.call_id: tool_result(c, state) for c in previous.calls})
                self.sessions.move_to_end(event.run_id)
                return live
        if live is not None:
            live.cancel()
        return await self._start(state, event, agent)

    async def _start(
        self, state: RunState, event: LlmRequested, agent: PythonAgent
    ) -> Session | LlmFailed:
        assert event.run_id is not None and state.task is not None
        try:  # the module's top level runs once per version: not on the event loop
            code = await asyncio.to_thread(load, agent.path, agent.spec.agent_class)
        except AgentLoadError as exc:
            return LlmFailed(kind="agent", message=str(exc), turn=event.turn)
        known = [
            Known(c.tool, dict(c.arguments), tool_result(c, state))
            for t in state.turns if t.index < event.turn for c in t.calls
        ]  # fmt: skip
        task = state.task
        request = Request(
            text=state.screened("task_input", task.id, task.text) or "",
            run_id=event.run_id, agent=agent.spec.name, tools=tuple(event.tools),
            session_id=task.session_id, tenant=task.tenant, workspace=task.workspace,
            version=agent.version,
        )  # fmt: skip
        session = Session(code.agent, request, known)
        self.sessions[event.run_id] = session
        while len(self.sessions) > SESSIONS:
            _, old = self.sessions.popitem(last=False)
            old.cancel()
        return session

    # -- health ------------------------------------------------------------------------------

    async def background(self) -> None:
        """Ask each Python agent of the active version ``on_health_check`` every
        ``health_every_s``; record changes as ``agent.health``."""
        if not self.health_every_s:
            return
        while True:
            with contextlib.suppress(Exception):  # a check must never stop the checks
                await self.check_health()
            await asyncio.sleep(self.health_every_s)

    async def check_health(self) -> list[AgentHealth]:
        """One round of health checks; returns (and appends) the changes."""
        await self.view.ready()
        loaded = self.view.current
        out: list[AgentHealth] = []
        for spec in loaded.agents.agents if loaded.agents is not None else ():
            agent = python_agent(loaded, self.view, spec.name)
            if agent is None:
                continue
            health = await self._check(agent)
            key = (agent.spec.name, agent.version)
            if self.health.get(key) == health.healthy:
                continue
            self.health[key] = health.healthy
            event = AgentHealth(source=self.name, agent=agent.spec.name, healthy=health.healthy,
                                detail=health.detail[:1000], version=agent.version)  # fmt: skip
            await self.log.append(event)
            out.append(event)
        return out

    async def _check(self, agent: PythonAgent) -> Health:
        try:
            code = load(agent.path, agent.spec.agent_class)
            health = await asyncio.wait_for(code.agent.on_health_check(), HEALTH_TIMEOUT_S)
        except AgentLoadError as exc:
            return Health(False, str(exc))
        except TimeoutError:
            return Health(False, f"on_health_check took longer than {HEALTH_TIMEOUT_S:g} s")
        except Exception as exc:  # the agent's code
            return Health(False, f"on_health_check raised {type(exc).__name__}: {exc}")
        if isinstance(health, bool):
            return Health(health)
        if not isinstance(health, Health):
            return Health(False, f"on_health_check returned {type(health).__name__}")
        return health
