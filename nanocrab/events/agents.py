"""What a Python agent (``nanocrab/pyagent``) records beside the run's usual events: its log
lines, its metrics and its health. Its model turns and tool calls are the ordinary
``llm.responded`` / ``tool.*`` events: a Python agent plays the model's part of a run."""

from __future__ import annotations

from typing import ClassVar, Literal

from nanocrab.events.base import Event, SubjectKind

LogLevel = Literal["debug", "info", "warning", "error"]


class AgentLogged(Event, frozen=True, tag="agent.logged"):
    """A line the agent's code logged with ``context.log`` during the run."""

    agent: str
    message: str
    level: LogLevel = "info"
    turn: int = 0  # the model turn (``llm.requested``) the agent was answering


class AgentMetric(Event, frozen=True, tag="agent.metric"):
    """A measurement the agent's code emitted with ``context.emit_metric`` during the run.
    ``labels``: low-cardinality dimensions (the agent name is added as ``agent``)."""

    agent: str
    name: str
    value: float
    unit: str = ""
    labels: dict[str, str] = {}
    turn: int = 0


class AgentHealth(Event, frozen=True, tag="agent.health"):
    """The outcome of a Python agent's ``on_health_check`` (written when it changes, and on
    the first check of a process). ``version``: the configuration version whose code was
    checked (empty: the start-up configuration)."""

    subject_kind: ClassVar[SubjectKind] = "system"

    agent: str
    healthy: bool
    detail: str = ""
    version: str = ""
