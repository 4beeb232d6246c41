"""Is an event where it was stored? The one check every reader of the log applies.

The broker decides who may publish on which subject (``bus/permissions.py``), but it cannot look
inside a message: an identity allowed to publish ``…<run>.llm.responded`` could store a payload
whose ``type`` says ``tool.requested``. A stored event is therefore believed only when its subject
is exactly the one :meth:`Subjects.for_event` would give it — same root (log or ephemeral, as the
type says), tenant, kind, id, family and name. Then the broker's permission for that subject *is*
the permission for that event type, and a misplaced event is reported and ignored everywhere:
handlers (``bus/runtime.py``), run loaders, replay, projections and the CLI all decode stored
bytes through :func:`decode_stored` (``EventLog.decode``), which applies :func:`misplaced`.
"""

from __future__ import annotations

from nanocrab.bus.subjects import Subjects
from nanocrab.events import Codec, DecodeErrorKind, Event, EventDecodeError


class Misplaced(EventDecodeError):
    """Stored bytes that decode to an event, but not one that belongs on their subject.

    An :class:`EventDecodeError` (kind ``invalid``), so every reader that skips undecodable
    bytes skips these too; ``event`` is what the bytes claim to be, for reports only — it must
    never be folded into any state.
    """

    def __init__(self, subject: str, event: Event, reason: str) -> None:
        super().__init__(DecodeErrorKind.INVALID, f"misplaced: {reason}")
        self.subject = subject
        self.event = event
        self.reason = reason


def misplaced(subjects: Subjects, subject: str, event: Event) -> str | None:
    """Why ``event`` does not belong on ``subject`` (``None`` when it does).

    The reason names the stored subject and the one the event's own envelope implies, so a dead
    letter or a timeline row says exactly what was forged or mis-routed.
    """
    expected = subjects.for_event(event)
    if subject == expected:
        return None
    return f"a {event.type} event stored on {subject} (its envelope belongs on {expected})"


def decode_stored(codec: Codec, subjects: Subjects, subject: str, data: bytes) -> Event:
    """The event stored as ``data`` on ``subject``.

    Raises :class:`EventDecodeError` when the bytes are not an event, and its subclass
    :class:`Misplaced` when they are one that was stored on another subject than its own.
    """
    event = codec.decode(data)
    reason = misplaced(subjects, subject, event)
    if reason is not None:
        raise Misplaced(subject, event, reason)
    return event


__all__ = ["Misplaced", "decode_stored", "misplaced"]
