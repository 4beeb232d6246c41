"""Skills, hot reload, memory and the bus's own records (malformed input, dead letters)."""

from __future__ import annotations

from typing import ClassVar, Literal

from nanocrab.events.base import Event, SubjectKind


class _SkillEvent(Event, frozen=True):
    subject_kind: ClassVar[SubjectKind] = "skill"

    name: str

    def subject_id(self) -> str:
        return self.name


class SkillPublished(_SkillEvent, frozen=True, tag="skill.published"):
    version: str
    sha256: str


class SkillActivated(_SkillEvent, frozen=True, tag="skill.activated"):
    version: str


class SkillRolledBack(_SkillEvent, frozen=True, tag="skill.rolled_back"):
    from_version: str
    to_version: str
    reason: str


class ReloadFailed(Event, frozen=True, tag="reload.failed"):
    subject_kind: ClassVar[SubjectKind] = "system"

    target: str
    version: str
    reason: str


class MemoryConsolidated(Event, frozen=True, tag="memory.consolidated"):
    subject_kind: ClassVar[SubjectKind] = "session"

    episode_id: str
    summary: str


class MemoryRecalled(Event, frozen=True, tag="memory.recalled"):
    """Memories added to a run's prompt (similar earlier tasks), with their cosine scores: the
    timeline shows the sources, and a replay reads them here instead of searching again."""

    item_ids: list[str]
    scores: list[float]
    texts: list[str] = []


DeadLetterKind = Literal[
    "malformed",
    "unknown_type",
    "invalid",
    "oversized",
    "unsupported_version",
    "poison",
    "max_deliveries",
]


class _DeadLetterRecord(Event, frozen=True):
    """Where a message a handler could not process is recorded instead of being lost.

    ``stream``/``stream_seq`` point at the original bytes, which stay in the log stream.
    """

    subject_kind: ClassVar[SubjectKind] = "system"

    handler: str
    stream: str
    stream_seq: int
    subject: str
    reason_kind: DeadLetterKind
    reason: str
    deliveries: int = 1
    preview: str = ""

    def subject_id(self) -> str:
        return self.handler


class BusMalformed(_DeadLetterRecord, frozen=True, tag="bus.malformed"):
    """Bytes on the log that do not decode to an event (bad JSON, unknown type, ...)."""


class BusDeadLettered(_DeadLetterRecord, frozen=True, tag="bus.dead_lettered"):
    """A valid event its handler failed on permanently (raised, or ran out of deliveries)."""
