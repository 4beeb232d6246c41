"""Replay with ordered ephemeral consumers: by run, by sequence range, by time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from nats.js.api import ConsumerInfo

from nanocrab.bus import EventLog, HandlerRuntime, Window, read, read_run
from nanocrab.events import ReplySent, TaskSubmitted
from nanocrab.handlers.echo import EchoReactor

from .conftest import eventually


async def test_replay_by_run_sequence_range_and_time(log: EventLog) -> None:
    for r in ("a", "b", "a", "b"):
        await log.append(ReplySent(text=r, run_id=r))
    await asyncio.sleep(0.05)
    middle = datetime.now(UTC)
    await asyncio.sleep(0.05)
    for r in ("a", "b"):
        await log.append(ReplySent(text=f"late {r}", run_id=r))

    run_a = await read_run(log, "a")
    assert [s.seq for s in run_a] == [1, 3, 5]
    assert [s.event.text for s in run_a] == ["a", "a", "late a"]  # type: ignore[union-attr]

    everything = log.subjects.log_all
    ranged = [s.seq async for s in read(log, everything, Window(start_seq=2, end_seq=4))]
    assert ranged == [2, 3, 4]
    since = [s.seq async for s in read(log, everything, Window(start_time=middle))]
    assert since == [5, 6]
    assert [s async for s in read(log, everything, Window(start_seq=99))] == []
    assert await read_run(log, "nobody") == []


async def test_replay_never_touches_a_handler_consumer(log: EventLog) -> None:
    runtime = HandlerRuntime(log, EchoReactor())
    await runtime.ensure_consumer()
    await log.append(TaskSubmitted(text="pending for the handler", run_id="r"))

    async def pending_one() -> ConsumerInfo | None:
        # the server counts a consumer's pending messages asynchronously: wait until it has
        info = await log.js.consumer_info(log.cfg.log_stream, "echo")
        return info if info.num_pending == 1 else None

    before = await eventually(pending_one)
    replayed = await read_run(log, "r")
    assert len(replayed) == 1
    after = await log.js.consumer_info(log.cfg.log_stream, "echo")
    assert (
        (after.num_pending, after.delivered.stream_seq)
        == (before.num_pending, before.delivered.stream_seq)
        == (1, 0)
    )
    durables = [
        c.name for c in await log.js.consumers_info(log.cfg.log_stream) if c.config.durable_name
    ]
    assert durables == ["echo"]


async def test_undecodable_messages_show_up_in_a_replay(log: EventLog) -> None:
    await log.js.publish(f"{log.cfg.root}.default.run.r.reply.sent", b"not an event")
    await log.append(ReplySent(text="fine", run_id="r"))
    replayed = await read_run(log, "r")
    assert replayed[0].event is None and replayed[0].error is not None
    assert replayed[0].error.kind.value == "malformed" and replayed[0].raw == b"not an event"
    assert replayed[1].event is not None
