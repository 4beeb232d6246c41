"""Appending a handler's reaction to an event: deterministic ids and the cause's envelope
(:func:`stamp`), a guarded decision of several events in order (:func:`append_reaction`,
:func:`append_chained`) or in one round trip (:func:`append_decision_pipelined`). Used by the
handler runtime (``bus/runtime.py``) and by handlers that append outside a delivery."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from nanocrab.bus.errors import AppendConflict
from nanocrab.bus.log import Appended, EventLog, Expect
from nanocrab.bus.reactor import Reaction
from nanocrab.bus.subjects import matches_filter
from nanocrab.events import Event, derive_event_id


def stamp(
    reactor_name: str, cause: Event, reactions: Sequence[Event], *, first: int = 0
) -> list[Event]:
    """Give each reaction its deterministic id and inherit the cause's envelope where unset.

    Reactions returned to the runtime use ordinals from 0; a handler appending progress events
    itself (``tool.started``, output chunks) stamps them with ``first`` well above that range.
    """
    out: list[Event] = []
    for i, r in enumerate(reactions, first):
        out.append(
            msgspec.structs.replace(
                r,
                id=derive_event_id(reactor_name, cause.id, i),
                source=reactor_name,
                causation_id=cause.id,
                correlation_id=r.correlation_id or cause.correlation_id or cause.id,
                tenant=cause.tenant if r.tenant == "default" else r.tenant,
                task_id=r.task_id or cause.task_id,
                run_id=r.run_id or cause.run_id,
                session_id=r.session_id or cause.session_id,
                step_id=r.step_id or cause.step_id,
            )
        )
    return out


async def append_reaction(
    log_: EventLog, handler: str, cause: Event, reaction: Reaction, *, first: int = 0
) -> bool:
    """Stamp and append a reaction; ``False`` when its precondition failed and nothing of it
    was stored (the first event carries the ``expect``, the rest follow as one batch)."""
    events = stamp(handler, cause, reaction.events, first=first)
    if not events:
        return True
    if reaction.expect is not None:
        if reaction.chained:
            try:
                if await append_decision_pipelined(log_, events, reaction.expect):
                    return True
            except AppendConflict:
                return False  # as below: the newer event that slipped in decides
        try:
            appended = await log_.append(events[0], expect=reaction.expect)
            while appended.duplicate and await _taken(log_, appended):
                # A decision re-made after part of it landed (an append failed in between: a
                # cluster electing a stream leader) holds only what is missing, so its ordinals
                # restart at 0 and its first event got the id of one already stored — another
                # event, on another subject; JetStream took it for a copy. Shift past it.
                first += 1
                events = stamp(handler, cause, reaction.events, first=first)
                appended = await log_.append(events[0], expect=reaction.expect)
            if reaction.chained:
                await append_chained(log_, appended, events[1:], reaction.expect.scope,
                                     neutral=reaction.expect.neutral)  # fmt: skip
                return True
        except AppendConflict:
            return False
        events = events[1:]
    await log_.append_batch(events)
    return True


def pipelinable(log_: EventLog, events: Sequence[Event]) -> bool:
    """Whether a decision's events may go out in one round trip (``EventLog.append_pipelined``):
    all of them on the log stream (an ephemeral event lives on another stream), and the stream
    not replicated. On an R3 stream of nats-server 2.15.1 the pipelined messages' expectations
    stalled the stream under load (appends unacknowledged for seconds, direct gets
    unavailable: tests/test_scale_failover.py before any fault), so a cluster takes the careful
    way, a round trip per event."""
    return log_.cfg.replicas == 1 and not any(e.ephemeral for e in events)


async def append_decision_pipelined(
    log_: EventLog, events: Sequence[Event], expect: Expect
) -> bool:
    """Try a chained decision (stamped) in one round trip (:meth:`EventLog.append_pipelined`).
    ``True``: its first event landed so, and what did not follow it was appended after it the
    careful way (:func:`append_chained`, whose :class:`AppendConflict` propagates). ``False``:
    nothing landed (or the decision is not :func:`pipelinable`): append it the careful way."""
    if len(events) < 2 or not pipelinable(log_, events):
        return False
    landed = await log_.append_pipelined(events, expect)
    if not landed:
        return False
    await append_chained(log_, landed[-1], events[len(landed):], expect.scope,
                         neutral=expect.neutral)  # fmt: skip
    return True


async def _taken(log_: EventLog, appended: Appended) -> bool:
    """Whether a duplicate append's id belongs to another event (stored on another subject)."""
    return (await log_.get(appended.seq)).subject != appended.subject


async def append_chained(
    log_: EventLog,
    after: Appended,
    events: Sequence[Event],
    scope: str | None,
    *,
    neutral: Callable[[Event], bool] | None = None,
) -> None:
    """Append ``events`` (stamped) after ``after``, in order: each one on ``scope`` expecting the
    last one on it before as the scope's last, so nothing lands on top of an event another
    writer slipped in (:class:`AppendConflict`; the rest is not appended) unless all that
    slipped in is ``neutral`` (:attr:`Expect.neutral`). Events elsewhere (a parent run's, a
    session's) are appended unguarded in their place; trailing ones as a batch."""
    events = list(events)
    last = after.seq
    while events and scope is not None:
        if not any(_in_scope(log_.subjects.for_event(e), scope) for e in events):
            break
        event = events.pop(0)
        if _in_scope(log_.subjects.for_event(event), scope):
            last = (await log_.append(event, expect=Expect(last, scope, neutral))).seq
        else:
            await log_.append(event)
    await log_.append_batch(events)


def _in_scope(subject: str, scope: str | None) -> bool:
    """Whether ``subject`` matches the subject filter ``scope`` (``None``: any subject)."""
    return scope is None or matches_filter(subject.split("."), scope.split("."))
