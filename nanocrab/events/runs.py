"""Task, run, routing, plan, step, message, subagent and reply events."""

from __future__ import annotations

from typing import ClassVar, Literal

from nanocrab.events.base import Event, SubjectKind
from nanocrab.events.budget import Budget
from nanocrab.events.values import Capability, ImageBlock


class TaskSubmitted(Event, frozen=True, tag="task.submitted"):
    """A user goal entered the system. The run id is chosen by the submitter (first run).

    v2 renamed v1's ``prompt`` to ``text`` and added ``agent``; see ``upcast.py``.
    """

    schema_version: ClassVar[int] = 2

    text: str
    agent: str = "default"
    parent_run_id: str | None = None
    parent_call_id: str | None = None  # the parent's ``spawn`` call this run answers
    parent_session_id: str | None = None  # where the answer goes back to
    tools: list[str] | None = None  # restrict the agent profile's tools (subagents); None = all
    skills: list[str] = []  # skills to preload (their bodies go into the system prompt)
    workspace: str | None = None  # directory the run's tools may touch; None = agent default
    max_steps: int | None = None
    # a capability budget: narrows (never widens) what the policy rules allow for this run;
    # None = the rules alone decide
    capabilities: list[Capability] | None = None
    budget: Budget | None = None  # caps on this run's model spending (docs/observability.md)
    # images given with the task (CLI ``--image``, the gateway): each names its object-store
    # artifact (a content hash), never inline; the model sees them after the text
    images: list[ImageBlock] = []


class RunStarted(Event, frozen=True, tag="run.started"):
    """``guarded``: the guardrail checkpoints whose verdict the run waits for, pinned when the
    run starts (the chain had a filter for them), so replaying the run decides the same way.
    ``config``: the configuration version (``reload.activated``) the run is pinned to and
    finishes on; empty for the configuration a process loaded at start (and older logs).
    ``driver``: who answers the run's turns — the model (``llm.responded``, the LLM handler) or
    a Python agent (``agent.responded``, the pyagent host); a run believes only its driver's."""

    agent: str = "default"
    parent_run_id: str | None = None
    max_steps: int | None = None
    guarded: list[str] = []
    config: str = ""
    driver: Literal["model", "python"] = "model"


class RunCompleted(Event, frozen=True, tag="run.completed"):
    reply: str
    steps: int = 0


class RunFailed(Event, frozen=True, tag="run.failed"):
    """``rejected``: the run never started, its ``task.submitted`` was refused (see
    ``handlers/orchestrator/rejections.py``)."""

    kind: Literal[
        "llm", "tool", "timeout", "max_steps", "internal", "rejected", "guardrail", "budget",
        "agent",  # a Python agent's code failed (nanocrab/pyagent, docs/agents.md)
        "plan",  # a plan's step failed and its re-plans were spent (events/plans.py)
    ]
    reason: str


class RunCancelled(Event, frozen=True, tag="run.cancelled"):
    reason: str = ""
    by: str = ""


RUN_ENDS: tuple[str, ...] = ("run.completed", "run.failed", "run.cancelled")
"""The event types that end a run (one of them, once), in this order wherever they are listed."""


class RouteDecided(Event, frozen=True, tag="route.decided"):
    """The router's choice of agent for a task that named none (``handlers/router.py``).

    ``score``: the best agent's similarity (embedding) or 1.0 (llm, fallback); ``margin``: its
    lead over the runner-up; ``method``: how it was decided. The run replays this decision, it
    never recomputes it. ``confidence``/``fallback`` are v1's fields, kept consistent."""

    agent: str
    skills: list[str] = []
    confidence: float = 1.0
    fallback: bool = False
    score: float = 0.0
    margin: float = 0.0
    method: Literal["embedding", "llm", "fallback"] = "embedding"


class MessageQueued(Event, frozen=True, tag="message.queued"):
    """A user message for a live run: ``steer`` interrupts after the current tool call,
    ``follow_up`` starts a new turn after the current one ends."""

    mode: Literal["steer", "follow_up"]
    text: str


class SubagentSpawned(Event, frozen=True, tag="subagent.spawned"):
    child_run_id: str
    task: str
    tools: list[str] = []
    skills: list[str] = []
    call_id: str | None = None


class SubagentCompleted(Event, frozen=True, tag="subagent.completed"):
    child_run_id: str
    result: str
    is_error: bool = False


class ReplySent(Event, frozen=True, tag="reply.sent"):
    text: str


class SessionArchived(Event, frozen=True, tag="session.archived"):
    """A session was closed (``/new``); its history no longer feeds new tasks."""

    subject_kind: ClassVar[SubjectKind] = "session"

    reason: str = ""
    next_session_id: str | None = None


class SessionBranched(Event, frozen=True, tag="session.branched"):
    """A new session (the envelope's ``session_id``) forked from event ``at_event_id`` of run
    ``parent_run_id`` (of session ``parent_session_id``; ``None`` for a run without one).

    Nothing is copied: a task of the branch sees the parent's history up to and including the
    fork event (``at_seq``, its stream sequence), then the branch's own messages
    (``handlers/branches.py``). Appended before the branch's first task; the first one of a
    session stands. ``at_type``: the fork event's type, for timelines; ``by``: who branched."""

    subject_kind: ClassVar[SubjectKind] = "session"

    parent_run_id: str
    at_event_id: str
    at_seq: int
    parent_session_id: str | None = None
    at_type: str = ""
    by: str = ""
