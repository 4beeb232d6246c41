"""Tool calls (the capability lifecycle is in :mod:`nanocrab.events.capabilities`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from nanocrab.events.base import Event
from nanocrab.events.tool_details import ToolDetails
from nanocrab.events.values import ArtifactRef, Capability, ContentBlock

ToolErrorKind = Literal[
    "denied",  # no grant: policy said no, or the grant did not verify
    "invalid_arguments",  # arguments do not match the tool's schema
    "unknown_tool",
    "not_found",  # a path or resource that does not exist
    "path_escape",  # a path outside the granted workspace
    "timeout",
    "aborted",  # the run was cancelled (or failed) while the tool ran
    # an earlier invocation started and never completed (the executor died); not run again,
    # its effects are unknown
    "interrupted",
    "failed",  # the tool ran and reported failure (non-zero exit, HTTP error, no match, ...)
    # the server behind the tool (an MCP server) could not be started or reached, or went away
    # during the call; its effects are unknown
    "unavailable",
    "internal",  # a bug in the tool
]


class ToolRequested(Event, frozen=True, tag="tool.requested"):
    """``guardrail``: set when the guardrails asked for a person's approval of this call (their
    reason); the policy then asks for one whatever its rules say (at least the Guarded tier)."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    capabilities: list[Capability] = []
    guardrail: str | None = None


class ToolStarted(Event, frozen=True, tag="tool.started"):
    """``backend``: the operations backend the call runs on when it is not the executor's own
    host (``ssh:<name>``, from ``backends.yaml``); ``None``: local."""

    call_id: str
    tool: str
    invocation_id: str
    grant_id: str | None = None
    backend: str | None = None


class ToolOutput(Event, frozen=True, tag="tool.output"):
    ephemeral: ClassVar[bool] = True

    call_id: str
    stream: Literal["stdout", "stderr"]
    chunk: str


class ToolCompleted(Event, frozen=True, tag="tool.completed"):
    call_id: str
    tool: str
    is_error: bool = False
    content: list[ContentBlock] = []
    error_kind: ToolErrorKind | None = None
    details: ToolDetails | None = None
    artifacts: list[ArtifactRef] = []
    duration_ms: float = 0.0


class ToolResolved(ToolCompleted, frozen=True, tag="tool.resolved"):
    """The result of a call the orchestrator settles itself, the only kind it may publish (the
    broker lets only the executor publish ``tool.completed``): the result of a call to one of
    :data:`ORCHESTRATOR_TOOLS`, granted by the policy like any other, or the refusal of a call
    the guardrails blocked before it reached the policy. A subclass of :class:`ToolCompleted`, so
    whatever reads a call's result reads both.

    Believed only where :func:`orchestrator_may_resolve` says so: a resolution of a call the
    executor runs (it holds a grant for another tool), or a refusal no guardrail verdict stands
    behind, is ignored by the run state and the audit — a compromised orchestrator cannot make a
    granted call look refused, or completed without running (docs/security.md)."""


ORCHESTRATOR_TOOLS: frozenset[str] = frozenset({"spawn", "plan"})
"""The tools the orchestrator runs itself (on a grant, like any other): their results are
``tool.resolved`` events."""


def orchestrator_may_resolve(
    resolved: ToolResolved, *, granted_tool: str | None, requested: bool, blocked: bool
) -> bool:
    """Whether ``resolved`` may stand as the result of its call: the call's signed grant is for
    a tool the orchestrator runs (``granted_tool``), or it is a refusal of a call that never
    went to the policy (``requested``: a ``tool.requested`` for it was seen) and that a
    guardrail verdict blocked (``blocked``)."""
    if granted_tool is not None:
        return granted_tool in ORCHESTRATOR_TOOLS
    return resolved.is_error and blocked and not requested


class ToolSkipped(Event, frozen=True, tag="tool.skipped"):
    call_id: str
    tool: str
    reason: Literal["steered", "cancelled", "max_steps"]
