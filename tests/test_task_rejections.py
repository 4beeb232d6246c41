"""A task that cannot start is rejected on its own run, where its publisher listens.

The outside client here is a plain NATS connection publishing hand-written JSON, as a nats.js or
Go client written from docs/events.md §6 would; it follows ``<root>.*.run.<run_id>.>`` and must
see the run end either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from nanocrab.bus import EventLog, HandlerRuntime, read, read_run
from nanocrab.events import (
    BusDeadLettered,
    BusMalformed,
    Codec,
    EventDecodeError,
    RunCompleted,
    RunFailed,
    RunStarted,
    TaskSubmitted,
    new_event_id,
    utcnow,
)
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.handlers.orchestrator.rejections import reject, task_run
from nanocrab.handlers.runstate import RunState

from .agent_fixtures import FAST
from .conftest import eventually


@pytest.fixture
async def orchestrator(log: EventLog) -> AsyncIterator[HandlerRuntime]:
    """The orchestrator alone: a rejected task never gets as far as a model."""
    runtime = HandlerRuntime(log, Orchestrator(log), options=FAST)
    await runtime.ensure_consumer()
    task = asyncio.create_task(runtime.run())
    yield runtime
    runtime.stop()
    await asyncio.wait_for(task, 10)


@pytest.fixture
async def client(log: EventLog) -> AsyncIterator[nats.js.JetStreamContext]:
    """A NATS client that knows nothing of nanocrab but docs/events.md."""
    assert log.cfg.url
    nc = await nats.connect(log.cfg.url, name="outside")
    yield nc.jetstream()
    with contextlib.suppress(Exception):
        await nc.drain()


def documented_task(root: str, run_id: str, **changes: Any) -> tuple[str, dict[str, Any]]:
    """A ``task.submitted`` exactly as docs/events.md §6 shows it; ``changes`` replace (or, with
    ``None``, remove) top-level attributes."""
    subject = f"{root}.default.run.{run_id}.task.submitted"
    event: dict[str, Any] = {
        "specversion": "1.0", "id": new_event_id(), "type": "task.submitted",
        "source": "billing-portal", "time": utcnow().isoformat(),
        "datacontenttype": "application/json", "subject": subject, "tenant": "default",
        "taskid": run_id, "runid": run_id, "schemaversion": 2,
        "data": {"text": "summarise yesterday's incidents"},
    }  # fmt: skip
    for key, value in changes.items():
        if value is None:
            event.pop(key)
        else:
            event[key] = value
    return subject, event


async def publish(js: nats.js.JetStreamContext, subject: str, body: bytes, msg_id: str) -> None:
    ack = await js.publish(subject, body, headers={"Nats-Msg-Id": msg_id})
    assert not ack.duplicate


async def outcome(log: EventLog, run_id: str, timeout: float = 20.0) -> RunFailed | RunCompleted:
    """What a client following the run sees at its end."""

    async def wait() -> RunFailed | RunCompleted:
        async for s in read(log, log.subjects.run(run_id), follow=True):
            if isinstance(s.event, RunFailed | RunCompleted):
                return s.event
        raise AssertionError("the log ended")

    return await asyncio.wait_for(wait(), timeout)


async def dead_letters(log: EventLog) -> list[BusMalformed | BusDeadLettered]:
    found = read(log, f"{log.cfg.root}.*.system.orchestrator.bus.*")
    return [s.event async for s in found if isinstance(s.event, BusMalformed | BusDeadLettered)]


async def test_a_task_without_schemaversion_is_rejected_on_its_run_saying_so(
    log: EventLog, orchestrator: HandlerRuntime, client: nats.js.JetStreamContext
) -> None:
    run_id = new_event_id()
    subject, event = documented_task(log.cfg.root, run_id, schemaversion=None)
    await publish(client, subject, json.dumps(event).encode(), event["id"])
    end = await outcome(log, run_id)
    assert isinstance(end, RunFailed) and end.kind == "rejected"
    assert '"schemaversion" is missing' in end.reason
    assert 'set "schemaversion": 2' in end.reason
    assert "KeyError" not in end.reason
    (letter,) = [d for d in await dead_letters(log) if d.subject == subject]
    assert letter.reason_kind == "invalid"


@pytest.mark.parametrize(
    ("changes", "body", "says"),
    [
        ({"time": None}, None, "missing required field `time`"),
        ({"data": {"agent": "default"}}, None, "missing required field `text`"),
        ({"runid": "01JWTH3J8R02R73A72VAZ22JWF"}, None, "misplaced"),
        ({}, b"{not json", "malformed"),
    ],
    ids=["no-time", "no-text", "other-runid", "not-json"],
)
async def test_a_malformed_task_is_rejected_on_its_run(
    log: EventLog,
    orchestrator: HandlerRuntime,
    client: nats.js.JetStreamContext,
    changes: dict[str, Any],
    body: bytes | None,
    says: str,
) -> None:
    run_id = new_event_id()
    subject, event = documented_task(log.cfg.root, run_id, **changes)
    await publish(client, subject, body or json.dumps(event).encode(), new_event_id())
    end = await outcome(log, run_id)
    assert isinstance(end, RunFailed) and end.kind == "rejected"
    assert says in end.reason
    assert end.run_id == run_id and end.tenant == "default"


async def test_a_task_reusing_another_events_id_is_rejected_not_silently_dropped(
    log: EventLog, orchestrator: HandlerRuntime, client: nats.js.JetStreamContext
) -> None:
    first = TaskSubmitted(text="first", run_id=new_event_id(), source="t")
    await log.append(first)

    async def started() -> bool:
        return any(isinstance(s.event, RunStarted) for s in await read_run(log, first.run_id or ""))

    await eventually(started, timeout=20)
    # the same event id for another task, under another message id: stored, within the window
    second = TaskSubmitted(id=first.id, text="second", run_id=new_event_id(), source="t")
    _, subject, payload, _ = log.prepare(second)
    await publish(client, subject, payload, new_event_id())
    end = await outcome(log, second.run_id or "")
    assert isinstance(end, RunFailed) and end.kind == "rejected"
    assert f"its id {first.id} is already the id of another event" in end.reason
    assert not re.search(r"\.py:\d+", end.reason), "no source location for the publisher"
    assert not [
        s for s in await read_run(log, first.run_id or "") if isinstance(s.event, RunFailed)
    ]
    (letter,) = [d for d in await dead_letters(log) if d.subject == subject]
    assert letter.reason_kind == "poison" and "TaskRejected" in letter.reason


async def test_a_broken_copy_of_a_started_task_leaves_its_run_alone(
    log: EventLog, orchestrator: HandlerRuntime, client: nats.js.JetStreamContext
) -> None:
    task = TaskSubmitted(text="work", run_id=new_event_id(), source="t")
    await log.append(task)
    run_id = task.run_id or ""

    async def started() -> bool:
        return any(isinstance(s.event, RunStarted) for s in await read_run(log, run_id))

    await eventually(started, timeout=20)
    subject = f"{log.cfg.root}.default.run.{run_id}.task.submitted"
    await publish(client, subject, b"{broken", new_event_id())

    async def recorded() -> bool:
        return any(d.subject == subject for d in await dead_letters(log))

    await eventually(recorded, timeout=20)
    # a later rejection means the orchestrator has answered the earlier dead letter too
    other = new_event_id()
    other_subject, _ = documented_task(log.cfg.root, other)
    await publish(client, other_subject, b"{broken", new_event_id())
    assert isinstance(await outcome(log, other), RunFailed)
    assert not [s for s in await read_run(log, run_id) if isinstance(s.event, RunFailed)]


async def test_a_task_without_a_runid_is_dead_lettered_with_the_reason(
    log: EventLog, orchestrator: HandlerRuntime
) -> None:
    task = TaskSubmitted(text="nowhere", source="t")  # no run: subject token "-"
    await log.append(task)

    async def recorded() -> list[BusMalformed | BusDeadLettered]:
        return [d for d in await dead_letters(log) if ".run.-.task.submitted" in d.subject]

    (letter,) = await eventually(recorded, timeout=20)
    assert letter.reason_kind == "poison" and "needs a runid" in letter.reason


# --- the pure part: which dead letters are answered, and how -----------------------------------


def record(subject: str, reason_kind: str = "invalid", reason: str = "bad") -> BusMalformed:
    return BusMalformed(
        handler="orchestrator", stream="NANOCRAB_LOG", stream_seq=9, subject=subject,
        reason_kind=reason_kind, reason=reason, source="orchestrator",  # type: ignore[arg-type]
    )  # fmt: skip


def test_only_dead_letters_about_a_task_on_a_run_are_answered() -> None:
    from nanocrab.bus import Subjects

    subjects = Subjects("nanocrab", "nanocrab_eph")
    assert task_run(subjects, record("nanocrab.acme.run.R1.task.submitted")) == ("acme", "R1")
    assert task_run(subjects, record("nanocrab.acme.run.R1.message.queued")) is None
    assert task_run(subjects, record("nanocrab.acme.run.-.task.submitted")) is None
    assert task_run(subjects, record("other.acme.run.R1.task.submitted")) is None
    assert task_run(subjects, record("nanocrab.acme.run.R1.task")) is None


def test_a_run_that_started_is_never_failed_by_a_rejection() -> None:
    state = RunState("R1")
    state.apply(TaskSubmitted(text="x", run_id="R1", source="t"), 1)
    assert reject(state, record("s"), tenant="acme")
    state.apply(RunStarted(run_id="R1", source="orchestrator"), 2)
    assert reject(state, record("s"), tenant="acme") == []


def test_a_rejection_carries_the_reason_without_the_source_location() -> None:
    poison = record("s", "poison", "TaskRejected: its id X is taken at /src/nanocrab/x.py:12")
    (failed,) = reject(RunState("R1"), poison, tenant="acme")
    assert (failed.kind, failed.run_id, failed.tenant) == ("rejected", "R1", "acme")
    assert failed.reason == "the task was rejected (poison): TaskRejected: its id X is taken"


@pytest.mark.parametrize("missing", ["specversion", "id", "type", "source", "time"])
def test_a_missing_envelope_attribute_is_named(missing: str) -> None:
    _, event = documented_task("nanocrab", "R1", **{missing: None})
    with pytest.raises(EventDecodeError, match=f"missing required field `{missing}`"):
        Codec().decode(json.dumps(event).encode())


def test_a_missing_schemaversion_says_so_instead_of_a_key_error() -> None:
    _, event = documented_task("nanocrab", "R1", schemaversion=None)
    with pytest.raises(EventDecodeError) as info:
        Codec().decode(json.dumps(event).encode())
    assert info.value.kind == "invalid"
    assert '"schemaversion" is missing' in info.value.message
    assert "KeyError" not in info.value.message
    old = {**event, "data": {"prompt": "a v1 task"}}  # real v1 data still reads as v1
    decoded = Codec().decode(json.dumps(old).encode())
    assert isinstance(decoded, TaskSubmitted) and decoded.text == "a v1 task"
