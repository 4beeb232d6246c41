"""The envelope every event carries.

Subclasses add their payload fields and a ``tag`` (the CloudEvents ``type``, ``family.name``).
Envelope fields are keyword-only with defaults so payload fields can stay required.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

import msgspec

from nanocrab.events.ids import new_event_id, utcnow

SubjectKind = Literal["run", "session", "skill", "capability", "system"]

ENVELOPE_FIELDS: frozenset[str] = frozenset(
    {
        "id",
        "time",
        "source",
        "tenant",
        "task_id",
        "run_id",
        "step_id",
        "session_id",
        "causation_id",
        "correlation_id",
        "trace",
    }
)


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Envelope fields shared by every event (DESIGN §4).

    Class attributes (not serialised):
      * ``schema_version`` — the current version of this type's ``data``; older stored versions are
        upcast on read.
      * ``subject_kind`` — the ``kind`` token of the NATS subject (``run``, ``session``, ...).
      * ``ephemeral`` — stored on the short-retention stream (token deltas, output chunks).
    """

    id: str = msgspec.field(default_factory=new_event_id)
    time: datetime = msgspec.field(default_factory=utcnow)
    source: str = "cli"
    tenant: str = "default"
    task_id: str | None = None
    run_id: str | None = None
    step_id: str | None = None
    session_id: str | None = None
    causation_id: str | None = None
    correlation_id: str | None = None
    trace: str | None = None

    schema_version: ClassVar[int] = 1
    subject_kind: ClassVar[SubjectKind] = "run"
    ephemeral: ClassVar[bool] = False

    type_tag: ClassVar[str] = ""
    """Cached copy of the msgspec tag (reading ``__struct_config__`` allocates every time)."""

    @property
    def type(self) -> str:
        """The event type string, ``family.name`` (the msgspec tag)."""
        # msgspec types a tag str | int | None; every Event's tag is a str (class name or given)
        return self.type_tag or self.__struct_config__.tag  # type: ignore[return-value]

    def subject_id(self) -> str:
        """The ``id`` token of this event's subject: the run, session, skill, ... it belongs to."""
        if self.subject_kind == "run":
            return self.run_id or "-"
        if self.subject_kind == "session":
            return self.session_id or "-"
        return self.source
