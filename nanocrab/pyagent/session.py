"""One run of a Python agent, suspended at each tool call.

A :class:`Session` runs ``agent.handle(request, context)`` as a task. Each
``context.tools.call`` either returns a result already known (the session was started again
for a run begun elsewhere: the calls it made are answered from the log, in order) or registers
a pending call and waits. :meth:`Session.next` waits until the agent is stuck on new calls
(everything started together, e.g. with ``asyncio.gather``, is collected), finished or failed,
and says which: the host answers the run's model turn with that. :meth:`Session.resolve` hands
the results of the last turn's calls back in.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nanocrab.events import Event
from nanocrab.pyagent.api import Agent, Context, ReplayDiverged, Request, Response, ToolResult

GATHER_YIELDS = 8
"""Event-loop turns given to the agent after its first new call, for calls started beside it."""


@dataclass(frozen=True, slots=True)
class Known:
    """A call the agent made earlier in the run, with the result the log holds for it."""

    tool: str
    arguments: dict[str, Any]
    result: ToolResult


@dataclass(slots=True)
class Pending:
    index: int
    call_id: str
    tool: str
    arguments: dict[str, Any]
    future: asyncio.Future[ToolResult] = field(repr=False)


@dataclass(frozen=True, slots=True)
class Calls:
    """The agent waits on these calls."""

    calls: list[Pending]


@dataclass(frozen=True, slots=True)
class Finished:
    response: Response


@dataclass(frozen=True, slots=True)
class Crashed:
    """The agent raised, returned something else than a Response, or took too long."""

    message: str
    trace: str = ""


@dataclass(frozen=True, slots=True)
class Gone:
    """The run ended while the agent worked: nothing to answer."""


Outcome = Calls | Finished | Crashed | Gone


def call_id(run_id: str, index: int) -> str:
    """The id of the agent's ``index``-th call in run ``run_id``: the same in every process
    (a redelivered or resumed turn asks for the same call)."""
    digest = hashlib.sha256(f"pyagent:{run_id}:{index}".encode()).hexdigest()
    return f"toolu_{digest[:24]}"


class _SessionTools:
    def __init__(self, session: Session, names: tuple[str, ...]) -> None:
        self._session = session
        self._names = names

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolResult:
        return await self._session.call(name, dict(arguments or {}))


class Session:
    """One run of ``agent``; ``known``: its calls already answered in the log, in order."""

    def __init__(self, agent: Agent, request: Request, known: list[Known]) -> None:
        self.request = request
        self.known = known
        self.calls = 0
        self.pending: list[Pending] = []
        self.sent: dict[str, Pending] = {}
        self.events: list[Event] = []
        self.turn = -1  # the model turn last answered
        self._wake = asyncio.Event()
        self.context = Context(request, _SessionTools(self, request.tools), self._record)
        self.task: asyncio.Task[Response] = asyncio.create_task(
            agent.handle(request, self.context), name=f"pyagent-{request.run_id}"
        )
        self.task.add_done_callback(lambda _t: self._wake.set())

    @property
    def replaying(self) -> bool:
        return self.calls < len(self.known)

    def _record(self, event: Event) -> None:
        if not self.replaying:  # what it logged before its known calls is in the log already
            self.events.append(event)

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        index = self.calls
        self.calls += 1
        if index < len(self.known):
            known = self.known[index]
            if known.tool != tool or known.arguments != arguments:
                raise ReplayDiverged(
                    f"resumed, the agent's call {index} is {tool}({arguments}) where it was "
                    f"{known.tool}({known.arguments})"
                )
            return known.result
        future: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        self.pending.append(
            Pending(index, call_id(self.request.run_id, index), tool, arguments, future)
        )
        self._wake.set()
        return await future

    def resolve(self, results: Mapping[str, ToolResult]) -> None:
        """Hand in the results of the calls sent with the last answer (by call id)."""
        for cid, result in results.items():
            pending = self.sent.pop(cid, None)
            if pending is not None and not pending.future.done():
                pending.future.set_result(result)

    def take_events(self) -> list[Event]:
        out, self.events = self.events, []
        return out

    async def next(
        self,
        turn: int,
        timeout_s: float,
        *,
        ended: Callable[[], Awaitable[bool]] | None = None,
        poll_s: float = 0.5,
    ) -> Outcome:
        """Wait for the agent's answer to model turn ``turn``. ``ended``: asked every
        ``poll_s`` while the agent works; when it says the run ended (cancelled, timed out),
        the agent is cancelled and :class:`Gone` returned."""
        self.turn = turn
        self.context.turn = turn
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.pending and not self.task.done():
            self._wake.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                self.cancel()
                return Crashed(f"no answer and no tool call within {timeout_s:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(remaining, poll_s))
            if ended is not None and not self.pending and not self.task.done() and await ended():
                self.cancel()
                return Gone()
        if self.pending and not self.task.done():
            for _ in range(GATHER_YIELDS):
                await asyncio.sleep(0)
        if self.task.done():
            return self._finished()
        calls, self.pending = self.pending, []
        self.sent.update({p.call_id: p for p in calls})
        return Calls(calls)

    def _finished(self) -> Outcome:
        if self.task.cancelled():
            return Crashed("the agent's task was cancelled")
        exc = self.task.exception()
        if exc is not None:
            trace = "".join(traceback.format_exception(exc))
            return Crashed(f"{type(exc).__name__}: {exc}", trace[-3000:])
        response = self.task.result()
        if not isinstance(response, Response):
            return Crashed(f"handle returned {type(response).__name__}, not a Response")
        return Finished(response)

    def cancel(self) -> None:
        self.task.cancel()
        for p in [*self.pending, *self.sent.values()]:
            if not p.future.done():
                p.future.cancel()
