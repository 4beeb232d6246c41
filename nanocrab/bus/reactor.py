"""What a handler is, as the runtime sees it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from nanocrab.events import Event


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

    async def handle(self, event: Event) -> Sequence[Event]: ...
