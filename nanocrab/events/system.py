"""Skills, hot reload, memory and the bus's own records (malformed input, dead letters)."""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from nanocrab.events.base import Event, SubjectKind
from nanocrab.events.values import ArtifactRef


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
    """Kept so older logs decode; the reloader writes ``reload.rejected`` instead."""

    subject_kind: ClassVar[SubjectKind] = "system"

    target: str
    version: str
    reason: str


SWITCH_SUBJECT_ID = "config"
"""The subject ``id`` of the events that change the active configuration version
(``reload.activated``, ``reload.rolled_back``): one subject filter finds every switch."""


class ConfigFile(msgspec.Struct, frozen=True, kw_only=True):
    """One file of a configuration snapshot, relative to the configuration directory."""

    path: str
    sha256: str
    size: int


class ReloadProblem(msgspec.Struct, frozen=True, kw_only=True):
    """Why a snapshot was refused: the file, the 1-based line when known (0: unknown)."""

    file: str
    line: int = 0
    message: str


class ReloadProposed(Event, frozen=True, tag="reload.proposed"):
    """A new configuration snapshot was seen (``handlers/reloader.py``): ``version`` is the
    sha256 of the snapshot's canonical bytes, stored in the object store as ``snapshot``;
    ``changed`` the paths that differ from ``previous`` and ``diff`` a unified diff of them
    (cut at 64 KiB; the snapshot is the whole truth)."""

    subject_kind: ClassVar[SubjectKind] = "system"

    version: str
    previous: str = ""
    files: list[ConfigFile] = []
    changed: list[str] = []
    diff: str = ""
    snapshot: ArtifactRef | None = None


class ReloadRejected(Event, frozen=True, tag="reload.rejected"):
    """A proposed snapshot failed validation; the active version does not change."""

    subject_kind: ClassVar[SubjectKind] = "system"

    version: str
    problems: list[ReloadProblem] = []


class ReloadActivated(Event, frozen=True, tag="reload.activated"):
    """From this point in the log on, new runs use ``version`` (runs already started finish
    on the version pinned in their ``run.started``). ``reason``: ``change`` (a validated file
    change) or ``manual`` (``nanocrab config activate``)."""

    subject_kind: ClassVar[SubjectKind] = "system"

    version: str
    previous: str = ""
    reason: Literal["change", "manual"] = "change"
    snapshot: ArtifactRef | None = None

    def subject_id(self) -> str:
        return SWITCH_SUBJECT_ID


class ReloadRolledBack(Event, frozen=True, tag="reload.rolled_back"):
    """From this point in the log on, new runs use ``version`` again (the one before
    ``from_version``): automatic when the health watch saw ``failed`` of ``runs`` runs on
    ``from_version`` fail, or ``nanocrab config rollback``."""

    subject_kind: ClassVar[SubjectKind] = "system"

    version: str
    from_version: str
    reason: str
    automatic: bool = False
    runs: int = 0
    failed: int = 0
    snapshot: ArtifactRef | None = None

    def subject_id(self) -> str:
        return SWITCH_SUBJECT_ID


class ReloadRequested(Event, frozen=True, tag="reload.requested"):
    """A person asked the reloader to switch (``nanocrab config activate V`` / ``rollback``):
    the reloader answers with ``reload.activated`` / ``reload.rolled_back`` or
    ``reload.rejected``. ``version`` may be a unique prefix; empty for a rollback."""

    subject_kind: ClassVar[SubjectKind] = "system"

    action: Literal["activate", "rollback"]
    version: str = ""
    by: str = ""


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
