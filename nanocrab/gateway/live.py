"""A run's events as a live feed for SSE and WebSocket clients, resumable from a position.

A position is ``<log seq>`` or ``<log seq>.<delta seq>``: the last log event (stream sequence
of the durable log) and the last model text delta (sequence of the ephemeral stream) the client
has seen. Every item carries its own position, so a client that reconnects with the last one
(SSE ``Last-Event-ID``, or ``?after=``) gets exactly what it missed: log events after the log
sequence — each one, in log order, none twice — and, while the run is live, the deltas after
the delta sequence. Deltas are ephemeral (they expire with the short-retention stream) and are
never the record: ``llm.responded`` carries the full text. The feed ends after the run's
terminal event (``run.completed``, ``run.failed``, ``run.cancelled``).

Each item is the event in CloudEvents JSON (the documented wire form, docs/events.md),
re-encoded from the decoded event, so upcasting and the placement check apply as for every
other reader: a message stored on the wrong subject is sent as a ``bus.rejected`` item.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from nanocrab.bus import EventLog, Stored, Window
from nanocrab.bus.replay import messages, to_stored
from nanocrab.bus.subjects import sanitize_token
from nanocrab.events import RUN_ENDS
from nanocrab.gateway.errors import Problem

TERMINAL = frozenset(RUN_ENDS)


@dataclass(frozen=True, slots=True)
class Position:
    """Where a client is: the last log and delta sequences it has (0: none)."""

    log: int = 0
    delta: int = 0

    @classmethod
    def parse(cls, text: str | None) -> Position:
        if not text:
            return cls()
        head, _, tail = text.strip().partition(".")
        try:
            log, delta = int(head), int(tail or 0)
        except ValueError:
            raise Problem(
                400, "bad-position", "Bad resume position",
                f"{text!r}: use <log seq> or <log seq>.<delta seq>, e.g. 42 or 42.7",
            ) from None  # fmt: skip
        if log < 0 or delta < 0:
            raise Problem(400, "bad-position", "Bad resume position", f"{text!r} is negative")
        return cls(log, delta)

    def __str__(self) -> str:
        return f"{self.log}.{self.delta}"


@dataclass(frozen=True, slots=True)
class Item:
    """One thing to send: ``type`` (the event type, ``bus.rejected`` for a message that is not
    a valid event here), ``data`` (CloudEvents JSON with ``seq``), ``position`` after it."""

    type: str
    data: str
    position: Position
    terminal: bool = False


def _item(log: EventLog, s: Stored, at: Position) -> Item:
    if s.event is None:
        data = json.dumps({"seq": s.seq, "subject": s.subject, "error": str(s.error)})
        return Item("bus.rejected", data, at)
    wire = log.codec.encode(s.event, subject=s.subject).decode()
    # the wire form is a JSON object: the sequence goes in as one more top-level member
    data = f'{{"seq":{s.seq},{wire[1:]}' if wire.startswith("{") else wire
    return Item(s.event.type, data, at, terminal=s.event.type in TERMINAL)


async def history(log: EventLog, tenant: str, run_id: str) -> list[Stored]:
    """The run's events so far (for the 404 check before a stream starts)."""
    subject = log.subjects.run(run_id, tenant=tenant)
    return [to_stored(log, m) async for m in messages(log, subject)]


async def feed(
    log: EventLog,
    tenant: str,
    run_id: str,
    after: Position,
    *,
    known: list[Stored],
    deltas: bool = True,
) -> AsyncGenerator[Item, None]:
    """Items after ``after``: first ``known`` (the history read for the 404 check), then live
    ones until the terminal event. Raises nothing for a client going away: the caller cancels."""
    at = after
    for s in known:
        if s.seq <= at.log:
            continue
        at = Position(s.seq, at.delta)
        item = _item(log, s, at)
        yield item
        if item.terminal:
            return
    if any(s.event is not None and s.event.type in TERMINAL for s in known):
        return  # resumed after the end: nothing more will come
    start = max(at.log, known[-1].seq if known else 0) + 1
    queue: asyncio.Queue[tuple[str, Stored] | None] = asyncio.Queue()

    async def pump_log() -> None:
        subject = log.subjects.run(run_id, tenant=tenant)
        try:
            async for m in messages(log, subject, Window(start_seq=start), follow=True):
                s = to_stored(log, m)
                await queue.put(("log", s))
                if s.event is not None and s.event.type in TERMINAL:
                    break
        finally:
            queue.put_nowait(None)  # the feed ends (the client resumes from its position)

    async def pump_deltas() -> None:
        t, r = sanitize_token(tenant), sanitize_token(run_id)
        subject = f"{log.cfg.ephemeral_root}.{t}.run.{r}.llm.delta"
        window = Window(start_seq=at.delta + 1)
        async for m in messages(
            log, subject, window, follow=True, stream=log.cfg.ephemeral_stream
        ):
            await queue.put(("delta", to_stored(log, m)))

    tasks = [asyncio.create_task(pump_log())]
    if deltas:
        tasks.append(asyncio.create_task(pump_deltas()))
    try:
        while True:
            got = await queue.get()
            if got is None:
                return
            kind, s = got
            if kind == "log":
                if s.seq <= at.log:
                    continue
                at = Position(s.seq, at.delta)
            else:
                if s.seq <= at.delta:
                    continue
                at = Position(at.log, s.seq)
            item = _item(log, s, at)
            yield item
            if item.terminal:
                return
    finally:
        for task in tasks:
            task.cancel()
        # a pump's own failure ended the feed already (the None above); it is not the client's
        await asyncio.gather(*tasks, return_exceptions=True)


def sse(item: Item) -> bytes:
    """One Server-Sent Events message: ``id`` is the position to resume from."""
    return f"id: {item.position}\nevent: {item.type}\ndata: {item.data}\n\n".encode()
