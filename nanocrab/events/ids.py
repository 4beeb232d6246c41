"""Event identifiers: ULIDs, so ids sort by creation time.

A reaction's id is *derived*: the same (handler, causation id, ordinal) always yields the same id,
which JetStream's duplicate window (``Nats-Msg-Id``) turns into exactly-once appends when a
handler is redelivered the event it already reacted to.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from ulid import ULID


def new_event_id() -> str:
    """A fresh, time-sortable 26-character ULID string."""
    return str(ULID())


def derive_event_id(
    handler: str, causation_id: str, ordinal: int, *, millis: int | None = None
) -> str:
    """The id of the ``ordinal``-th event ``handler`` emits in reaction to ``causation_id``.

    The timestamp part is the cause's (when the cause is a ULID), so a reaction sorts right after
    what caused it; the random part is a keyed hash of the triple. ``millis`` sets the timestamp
    part when the cause is not a ULID (a dead letter uses the original message's storage time).
    """
    digest = hashlib.blake2b(
        f"{handler}\x1f{causation_id}\x1f{ordinal}".encode(), digest_size=10
    ).digest()
    if millis is None:
        try:
            millis = ULID.from_str(causation_id).milliseconds
        except ValueError:
            millis = 0
    return str(ULID.from_bytes(millis.to_bytes(6, "big") + digest))


def utcnow() -> datetime:
    return datetime.now(UTC)


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The run id of the subagent that ``spawn`` call ``call_id`` of ``parent_run_id`` starts.

    Derived, so a redelivered spawn starts no second child, and so a re-run of the parent can
    tell which recorded child a new child stands for (``llm/replay.py``)."""
    return derive_event_id("spawn", f"{parent_run_id}/{call_id}", 0)
