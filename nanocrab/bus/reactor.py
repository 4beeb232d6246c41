"""What a handler is, as the runtime sees it."""

from __future__ import annotations

from collections.abc import Sequence
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


@dataclass(frozen=True, slots=True)
class Reaction:
    """Reactions with a precondition: the first event is appended with ``expect`` and, if the log
    moved on meanwhile (:class:`~nanocrab.bus.errors.AppendConflict`), the whole reaction is
    dropped — the newer event will be handled in its turn and decide on fuller state."""

    events: Sequence[Event] = field(default_factory=tuple)
    expect: Expect | None = None


class Reactor(Protocol):
    """A handler: consumes some event types, returns the events it wants appended.

    ``handle`` must be a function of the event and the state it reads through injected I/O, so a
    redelivery yields the same reactions; the runtime gives reaction *i* to event *e* the id
    ``derive_event_id(name, e.id, i)``, which makes a second append of it a no-op.

    Raise :class:`~nanocrab.bus.errors.TransientError` to be retried later with backoff; any other
    exception marks the event as poison for this handler (terminated, recorded as a dead letter).
    """

    name: str
    consumes: tuple[type[Event], ...]

    async def handle(self, event: Event, delivery: Delivery) -> Sequence[Event] | Reaction: ...
