"""The Python agent interface (seed 003): ``class Agent`` with ``async def handle(request,
context) -> Response``.

An agent's code plays the model's part of a run: where a model would answer a turn with tool
calls, the agent awaits ``context.tools.call(name, arguments)``; the call becomes the same
``llm.responded`` tool-use block → ``tool.requested`` → policy → executor → ``tool.completed``
chain a model's call does, and the await returns once the result is in the log. So an agent
holds no power of its own: its tools are the run's enabled tools, each call is decided by the
policy (a denial comes back as a :class:`ToolResult` with ``denied``), approvals and guardrails
apply as to any call. See docs/agents.md.

This module imports only the event vocabulary: agent code and its smoke tests import it (and
:mod:`nanocrab.pyagent.harness`) without the bus.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nanocrab.events import AgentLogged, AgentMetric, Event, LogLevel

MAX_LOG_CHARS = 4000
MAX_METRIC_LABELS = 8


class AgentError(Exception):
    """Root of the errors an agent's code may see from nanocrab (and may let escape: the run
    then fails with ``run.failed{kind: agent}``)."""


class ToolError(AgentError):
    """A tool call that failed, raised by the helpers that need a result (``recall``,
    ``remember``) and by :meth:`ToolResult.check`."""

    def __init__(self, result: ToolResult) -> None:
        what = "denied by policy" if result.denied else f"failed ({result.error_kind or 'error'})"
        super().__init__(f"tool {result.tool} {what}: {result.text}")
        self.result = result


class ReplayDiverged(AgentError):
    """The agent, run again from the start to resume a run (another process, a restart), did
    not repeat the tool calls it made the first time: its code must decide its calls from the
    request and the results alone."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One run's task, as the agent receives it. ``tools``: the tools enabled for the run (the
    agent's profile, narrowed by the task); ``version``: the configuration version the run is
    pinned to (empty: the start-up configuration)."""

    text: str
    run_id: str
    agent: str
    tools: tuple[str, ...] = ()
    session_id: str | None = None
    tenant: str = "default"
    workspace: str | None = None
    version: str = ""


@dataclass(frozen=True, slots=True)
class Response:
    """The agent's answer: ``text`` becomes the run's reply (``reply.sent``, ``run.completed``)."""

    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """What a tool call came back with — exactly what a model would have read for it.

    ``denied``: the policy refused the call (``grant.denied``) or a guardrail blocked it;
    ``skipped``: it was never run (the user steered, the run hit its step limit). ``text``:
    the result's text (for a denial, the reason)."""

    tool: str
    call_id: str
    text: str
    is_error: bool = False
    denied: bool = False
    skipped: bool = False
    error_kind: str | None = None

    @property
    def ok(self) -> bool:
        return not self.is_error

    def check(self) -> ToolResult:
        """This result, or :class:`ToolError` when the call failed or was denied."""
        if self.is_error:
            raise ToolError(self)
        return self


@dataclass(frozen=True, slots=True)
class Health:
    """The answer of :meth:`Agent.on_health_check`."""

    healthy: bool
    detail: str = ""


class Tools(Protocol):
    """The run's tools, as an agent calls them."""

    @property
    def names(self) -> tuple[str, ...]:
        """The tools enabled for the run (a call to another one is denied by the policy)."""
        ...

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolResult:
        """Call ``name`` with ``arguments``; returns when its result is in the log."""
        ...


Record = Callable[[Event], None]
"""Where a context's log lines and metrics go (the host stamps and appends them)."""


class Context:
    """What a running agent may use: the run's :attr:`tools`, memory (:meth:`recall`,
    :meth:`remember`, both ordinary tool calls), :meth:`emit_metric` and :meth:`log`."""

    def __init__(self, request: Request, tools: Tools, record: Record) -> None:
        self.request = request
        self.tools = tools
        self._record = record
        self.turn = 0  # set by the host: the model turn being answered

    async def recall(self, query: str, *, k: int = 5, kind: str | None = None) -> list[str]:
        """Memories by meaning (the ``recall`` tool: earlier tasks, notes, session summaries),
        best first, one line each; empty when nothing matches. :class:`ToolError` when the
        call is denied or fails."""
        args: dict[str, Any] = {"query": query, "k": k}
        if kind is not None:
            args["kind"] = kind
        result = (await self.tools.call("recall", args)).check()
        if result.text.strip() == "Nothing in memory matches.":
            return []
        return [line for line in result.text.splitlines() if line.strip()]

    async def remember(self, text: str) -> ToolResult:
        """Store a note in long-term memory (the ``remember`` tool)."""
        return (await self.tools.call("remember", {"text": text})).check()

    def emit_metric(
        self,
        name: str,
        value: float,
        *,
        unit: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Record a measurement (``agent.metric``, appended with the agent's next answer)."""
        tags = dict(labels or {})
        if len(tags) > MAX_METRIC_LABELS:
            raise ValueError(f"at most {MAX_METRIC_LABELS} labels per metric")
        self._record(
            AgentMetric(
                agent=self.request.agent, name=name, value=float(value), unit=unit,
                labels={str(k): str(v) for k, v in tags.items()}, turn=self.turn,
            )
        )  # fmt: skip

    def log(self, message: str, *, level: LogLevel = "info") -> None:
        """Record a log line (``agent.logged``, appended with the agent's next answer)."""
        self._record(
            AgentLogged(
                agent=self.request.agent, message=str(message)[:MAX_LOG_CHARS], level=level,
                turn=self.turn,
            )
        )  # fmt: skip


class Agent:
    """Subclass it and implement :meth:`handle`. One instance serves every run of one version
    of the code (runs may overlap): keep per-run state in locals, not on ``self``.

    The code must decide its tool calls from the request and the results it gets: a run that
    moves to another process (a restart, another instance) is resumed by running
    :meth:`handle` again from the start, with the calls already made answered from the log
    (:class:`ReplayDiverged` if it asks for different ones)."""

    async def handle(self, request: Request, context: Context) -> Response:
        raise NotImplementedError

    async def on_health_check(self) -> Health:
        """Whether the agent can work (its dependencies reachable, its data loaded); the host
        asks every so often and records changes as ``agent.health``. Default: healthy."""
        return Health(True)


SmokeTest = Callable[[Any], Awaitable[None]]
"""A module's optional ``async def smoke(harness)``: run when a new version of the module is
validated (in a subprocess, with a time limit); it raises (an ``assert``) when it fails."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """An agent's code, loaded: its instance and the hash of the module's bytes."""

    agent: Agent
    sha256: str
    path: str
    smoke: SmokeTest | None = field(default=None)
