"""What a handler is, as the runtime sees it."""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from nanocrab.bus.log import Expect
from nanocrab.events import Event


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where the event in hand sits in the log, and how often it has been delivered."""

    seq: int
    subject: str
    deliveries: int = 1


handling: ContextVar[Delivery | None] = ContextVar("nanocrab_handling", default=None)
"""The delivery whose ``handle`` is running (set by the runtime around the call, inherited by
tasks it starts). A reader of the log may rely on it: the event at ``seq`` on ``subject`` is
stored, so a state that has folded everything up to ``seq`` is the log as of that event
(``handlers/runloader.py`` then need not ask the server)."""


@dataclass(frozen=True, slots=True)
class Reaction:
    """Reactions with a precondition: the first event is appended with ``expect`` and, if the log
    moved on meanwhile (:class:`~nanocrab.bus.errors.AppendConflict`), the whole reaction is
    dropped — the newer event will be handled in its turn and decide on fuller state."""

    events: Sequence[Event] = field(default_factory=tuple)
    expect: Expect | None = None
    chained: bool = False
    """Guard every event in ``expect.scope``, not only the first: each is appended expecting the
    one before it as the scope's last, so a decision is never completed on top of another
    instance's decision that raced it (the reaction stops at the first conflict). One round trip
    for the whole reaction when nothing comes between its events
    (:meth:`~nanocrab.bus.log.EventLog.append_pipelined`), else one per guarded event."""


class Reactor(Protocol):
    """A handler: consumes some event types, returns the events it wants appended.

    ``handle`` must be a function of the event and the state it reads through injected I/O, so a
    redelivery yields the same reactions; the runtime gives reaction *i* to event *e* the id
    ``derive_event_id(name, e.id, i)``, which makes a second append of it a no-op.

    Raise :class:`~nanocrab.bus.errors.TransientError` to be retried later with backoff; a bus
    failure met on the way (a :class:`~nanocrab.bus.errors.BusError` other than
    :class:`~nanocrab.bus.errors.PublishRefused`, a NATS error) is retried the same way. Any other
    exception marks the event as poison for this handler (terminated, recorded as a dead letter).
    """

    name: str
    consumes: tuple[type[Event], ...]

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event] | Reaction: ...
