"""The closed vocabulary: every concrete event type, by its type string."""

from __future__ import annotations

from typing import Final

import msgspec

from nanocrab.events.agents import AgentHealth, AgentLogged, AgentMetric
from nanocrab.events.base import ENVELOPE_FIELDS, Event
from nanocrab.events.budget import BudgetExceeded, BudgetRaised, BudgetRefused
from nanocrab.events.capabilities import (
    CapabilityAutoEnabled,
    CapabilityDisabled,
    CapabilityEnabled,
    CapabilityGenerated,
    CapabilityInvoked,
    CapabilityRegistered,
    CapabilityRemoved,
    CapabilityRequested,
    CapabilityTested,
)
from nanocrab.events.guardrails import AlertRaised, GuardrailChecked
from nanocrab.events.hooks import HookApplied
from nanocrab.events.llm import (
    AgentResponded,
    ContextCompacted,
    LlmDelta,
    LlmFailed,
    LlmRequested,
    LlmResponded,
)
from nanocrab.events.plans import PlanCreated, PlanStepCompleted, PlanStepFailed, PlanStepStarted
from nanocrab.events.runs import (
    MessageQueued,
    ReplySent,
    RouteDecided,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    SessionArchived,
    SessionBranched,
    SubagentCompleted,
    SubagentSpawned,
    TaskSubmitted,
)
from nanocrab.events.security import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    GrantDenied,
    GrantIssued,
    GrantRevoked,
    SecurityRejected,
)
from nanocrab.events.system import (
    BusDeadLettered,
    BusMalformed,
    MemoryConsolidated,
    MemoryRecalled,
    ReloadActivated,
    ReloadFailed,
    ReloadProposed,
    ReloadRejected,
    ReloadRequested,
    ReloadRolledBack,
    SkillActivated,
    SkillPublished,
    SkillRolledBack,
)
from nanocrab.events.tools import (
    ToolCompleted,
    ToolOutput,
    ToolRequested,
    ToolResolved,
    ToolSkipped,
    ToolStarted,
)

AnyEvent = (
    TaskSubmitted | RunStarted | RunCompleted | RunFailed | RunCancelled
    | RouteDecided | GuardrailChecked | AlertRaised
    | PlanCreated | PlanStepStarted | PlanStepCompleted | PlanStepFailed
    | LlmRequested | LlmDelta | LlmResponded | AgentResponded | LlmFailed | ContextCompacted
    | ToolRequested | ToolStarted | ToolOutput | ToolCompleted | ToolResolved | ToolSkipped
    | CapabilityRequested | CapabilityGenerated | CapabilityTested | CapabilityRegistered
    | CapabilityEnabled | CapabilityAutoEnabled | CapabilityDisabled | CapabilityRemoved
    | CapabilityInvoked
    | GrantIssued | GrantDenied | GrantRevoked | SecurityRejected
    | ApprovalRequested | ApprovalGranted | ApprovalDenied | ApprovalExpired
    | MessageQueued | SubagentSpawned | SubagentCompleted
    | SkillPublished | SkillActivated | SkillRolledBack
    | ReloadFailed | ReloadProposed | ReloadRejected | ReloadActivated | ReloadRolledBack
    | ReloadRequested | MemoryConsolidated | MemoryRecalled | ReplySent | SessionArchived
    | SessionBranched
    | BusMalformed | BusDeadLettered | BudgetExceeded | BudgetRaised | BudgetRefused
    | AgentLogged | AgentMetric | AgentHealth
    | HookApplied
)  # fmt: skip
"""The tagged union of every event type; decode targets and exhaustive matches use it."""

EVENT_TYPES: Final[dict[str, type[Event]]] = {
    cls.__struct_config__.tag: cls for cls in AnyEvent.__args__
}

for _tag, _cls in EVENT_TYPES.items():
    _cls.type_tag = _tag


def payload_fields(cls: type[Event]) -> tuple[str, ...]:
    """The names of ``cls``'s ``data`` fields (everything that is not envelope)."""
    return tuple(f for f in cls.__struct_fields__ if f not in ENVELOPE_FIELDS)


def _data_struct(cls: type[Event]) -> type[msgspec.Struct]:
    fields: list[tuple[str, object] | tuple[str, object, object]] = []
    for f in msgspec.structs.fields(cls):
        if f.name in ENVELOPE_FIELDS:
            continue
        if f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, f.type, msgspec.field(default_factory=f.default_factory)))
        elif f.default is not msgspec.NODEFAULT:
            fields.append((f.name, f.type, f.default))
        else:
            fields.append((f.name, f.type))
    return msgspec.defstruct(f"{cls.__name__}Data", fields, frozen=True, kw_only=True)


DATA_STRUCTS: Final[dict[str, type[msgspec.Struct]]] = {
    name: _data_struct(cls) for name, cls in EVENT_TYPES.items()
}
"""Per type, a struct of just its ``data`` fields: decoding validates ``data`` in one pass."""
