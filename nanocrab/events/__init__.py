"""The event vocabulary: typed events, the envelope, ids, the CloudEvents codec, upcasters.

This package imports nothing else of nanocrab; every other layer speaks in these types.
"""

from nanocrab.events.base import ENVELOPE_FIELDS, Event, SubjectKind
from nanocrab.events.codec import DEFAULT_MAX_EVENT_BYTES, Codec
from nanocrab.events.errors import DecodeErrorKind, EventDecodeError, EventError, UpcastError
from nanocrab.events.ids import derive_event_id, new_event_id, utcnow
from nanocrab.events.llm import (
    ContextCompacted,
    LlmDelta,
    LlmFailed,
    LlmRequested,
    LlmResponded,
)
from nanocrab.events.registry import EVENT_TYPES, AnyEvent, payload_fields
from nanocrab.events.runs import (
    GuardrailEvaluated,
    MessageQueued,
    PlanCreated,
    ReplySent,
    RouteDecided,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepStarted,
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
)
from nanocrab.events.system import (
    BusDeadLettered,
    BusMalformed,
    DeadLetterKind,
    MemoryConsolidated,
    ReloadFailed,
    SkillActivated,
    SkillPublished,
    SkillRolledBack,
)
from nanocrab.events.tools import (
    CapabilityDisabled,
    CapabilityEnabled,
    CapabilityGenerated,
    CapabilityRegistered,
    CapabilityRemoved,
    CapabilityRequested,
    CapabilityTested,
    ToolCompleted,
    ToolOutput,
    ToolRequested,
    ToolSkipped,
    ToolStarted,
)
from nanocrab.events.upcast import UpcasterRegistry, default_upcasters
from nanocrab.events.values import (
    ArtifactRef,
    Capability,
    ContentBlock,
    ImageBlock,
    TextBlock,
    ToolUseBlock,
    Usage,
)

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES", "ENVELOPE_FIELDS", "EVENT_TYPES", "AnyEvent", "ApprovalDenied",
    "ApprovalExpired", "ApprovalGranted", "ApprovalRequested", "ArtifactRef", "BusDeadLettered",
    "BusMalformed", "Capability", "CapabilityDisabled", "CapabilityEnabled", "CapabilityGenerated",
    "CapabilityRegistered", "CapabilityRemoved", "CapabilityRequested", "CapabilityTested",
    "Codec", "ContentBlock", "ContextCompacted", "DeadLetterKind", "DecodeErrorKind", "Event",
    "EventDecodeError", "EventError", "GrantDenied", "GrantIssued", "GrantRevoked",
    "GuardrailEvaluated", "ImageBlock", "LlmDelta", "LlmFailed", "LlmRequested", "LlmResponded",
    "MemoryConsolidated", "MessageQueued", "PlanCreated", "ReloadFailed", "ReplySent",
    "RouteDecided", "RunCancelled", "RunCompleted", "RunFailed", "RunStarted", "SkillActivated",
    "SkillPublished", "SkillRolledBack", "StepCompleted", "StepStarted", "SubagentCompleted",
    "SubagentSpawned", "SubjectKind", "TaskSubmitted", "TextBlock", "ToolCompleted",
    "ToolOutput", "ToolRequested", "ToolSkipped", "ToolStarted", "ToolUseBlock", "UpcastError",
    "UpcasterRegistry", "Usage", "default_upcasters", "derive_event_id", "new_event_id",
    "payload_fields", "utcnow",
]  # fmt: skip
