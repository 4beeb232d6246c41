"""Every projection is idempotent on event id, and a projection that cannot apply says so.

The log can hold a second copy of an event: a producer that retries after the 2-minute duplicate
window stores it again (docs/events.md, Guarantees). The tests store such copies the way that
happens — the same bytes under another ``Nats-Msg-Id`` — after everything else and newest
first, so each copy comes after the events that changed what its original did (a grant refused
as forged, a capability enabled again, a newer version registered, a session archived a second
time), and no copy of a later event puts things right again. A copy must change nothing, live or
rebuilt, and the checkpoint must move past it. Contract tests: they run on SQLite and on
PostgreSQL (the ``engine`` fixture).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import BigInteger, Column, DateTime, MetaData, String, Table, Text, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import EventLog, Stored, Subjects
from nanocrab.cli.status import gather_status
from nanocrab.events import (
    AlertRaised,
    ApprovalGranted,
    ApprovalRequested,
    BusMalformed,
    Capability,
    CapabilityDisabled,
    CapabilityEnabled,
    CapabilityInvoked,
    CapabilityRegistered,
    Event,
    GrantIssued,
    GrantRevoked,
    GuardrailChecked,
    MessageQueued,
    ReplySent,
    RunCompleted,
    RunStarted,
    SecurityRejected,
    SessionArchived,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolStarted,
    new_event_id,
)
from nanocrab.projections import (
    Projection,
    ProjectionFailed,
    Projector,
    RunTimelineProjection,
    SessionsProjection,
    all_projections,
    capability,
    checkpoints,
    session_history,
)
from nanocrab.projections.db import metadata as projection_metadata

from .conftest import eventually

T0 = datetime(2025, 6, 3, 9, 0, tzinfo=UTC)
NAMES = [p.name for p in all_projections()]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run_env(run: str, t: float) -> dict[str, Any]:
    return {"run_id": run, "task_id": run, "session_id": "sess-1", "time": at(t), "source": "t"}


def grant(call: str, t: float, **kw: Any) -> GrantIssued:
    return GrantIssued(
        grant_id=f"g-{call}", call_id=call, tool="read",
        capabilities=[Capability(tool="read", resource="/ws")], scope="step", tier="safe",
        expires_at=at(t + 600), **run_env("run-1", t), **kw,
    )  # fmt: skip


def registered(version: str, t: float) -> CapabilityRegistered:
    return CapabilityRegistered(
        name="slugify", version=version, content_hash=version * 8, safety_level="safe",
        description=f"v{version}", entry="run", parameters={"type": "object"},
        time=at(t), source="capgen",
    )  # fmt: skip


def history() -> list[Event]:
    """A log that feeds every projection, where later events change what earlier ones did."""
    forged = grant("c2", 7)
    return [
        TaskSubmitted(text="tidy the notes", **run_env("run-1", 0)),
        RunStarted(**run_env("run-1", 1)),
        ToolRequested(call_id="c1", tool="read", arguments={"path": "a"}, **run_env("run-1", 2)),
        grant("c1", 3),
        ToolStarted(
            call_id="c1", tool="read", invocation_id="i1", grant_id="g-c1", **run_env("run-1", 4)
        ),
        ToolCompleted(call_id="c1", tool="read", content=[TextBlock("a")], **run_env("run-1", 5)),
        GuardrailChecked(checkpoint="tool_output", target_id="c1", action="block", tool="read",
                         fired=["f"], alerts=["f"], **run_env("run-1", 5)),
        AlertRaised(severity="critical", origin="guardrail", summary="f fired", filter_id="f",
                    **run_env("run-1", 5)),
        ToolRequested(call_id="c2", tool="read", arguments={"path": "b"}, **run_env("run-1", 6)),
        forged,
        SecurityRejected(
            rejected_id=forged.id,
            rejected_type="grant.issued",
            reason="bad signature",
            call_id="c2",
            **run_env("run-1", 8),
        ),
        ApprovalRequested(
            approval_id="appr-c3",
            call_id="c3",
            tool="exec",
            arguments={"command": "make"},
            tier="guarded",
            reason="runs a command",
            expires_at=at(600),
            rule="exec-guarded",
            **run_env("run-1", 9),
        ),
        ApprovalGranted(approval_id="appr-c3", approver="ana", **run_env("run-1", 10)),
        MessageQueued(mode="follow_up", text="and the todo list", **run_env("run-1", 11)),
        ReplySent(text="done", **run_env("run-1", 12)),
        RunCompleted(reply="done", steps=2, **run_env("run-1", 13)),
        GrantRevoked(grant_id="g-c1", call_id="c1", reason="run ended", **run_env("run-1", 14)),
        SessionArchived(
            session_id="sess-1",
            reason="/new",
            next_session_id="sess-2",
            time=at(15),
            run_id="run-2",
            source="t",
        ),
        SessionArchived(
            session_id="sess-1",
            reason="/new",
            next_session_id="sess-3",
            time=at(16),
            run_id="run-3",
            source="t",
        ),
        registered("1.0.0", 17),
        CapabilityDisabled(
            name="slugify", version="1.0.0", reason="flaky", time=at(18), source="cli"
        ),
        CapabilityEnabled(name="slugify", version="1.0.0", time=at(19), source="cli"),
        CapabilityInvoked(
            name="slugify",
            version="1.0.0",
            ok=True,
            outcome="ok",
            duration_ms=3.5,
            time=at(20),
            source="cli",
        ),
        registered("1.1.0", 21),
        BusMalformed(
            handler="orchestrator",
            stream="NANOCRAB_LOG",
            stream_seq=3,
            subject="x.y",
            reason_kind="malformed",
            reason="bad json",
            preview="{",
            time=at(22),
            source="orchestrator",
        ),
    ]


async def resend(log: EventLog, seq: int) -> int:
    """Store a second copy of the event at ``seq`` as a retry after the duplicate window would:
    the same bytes on the same subject, under a message id the server has not seen."""
    raw = await log.get(seq)
    ack = await log.js.publish(raw.subject, raw.data, headers={"Nats-Msg-Id": new_event_id()})
    assert not ack.duplicate
    return int(ack.seq)


def projection_named(name: str) -> Projection:
    return next(p for p in all_projections() if p.name == name)


async def contents(engine: AsyncEngine, projection: Projection) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    async with engine.connect() as conn:
        for table in projection.tables:
            result = await conn.execute(select(table).order_by(*table.primary_key.columns))
            out[table.name] = [tuple(r) for r in result]
    return out


async def caught_up(projector: Projector) -> bool:
    return projector.failure is None and await projector.behind() == 0


@pytest.mark.parametrize("name", NAMES)
async def test_a_second_copy_of_an_event_changes_nothing_live_or_rebuilt(
    log: EventLog, engine: AsyncEngine, name: str
) -> None:
    appended = await log.append_batch(history())
    projector = Projector(log, engine, projection_named(name), batch_size=5, idle_flush_s=0.001)
    await projector.setup()
    task = asyncio.create_task(projector.run())
    try:
        await eventually(lambda: caught_up(projector), interval=0.1)
        before = await contents(engine, projector.projection)
        assert any(before.values()), "the history feeds this projection"
        copies = [await resend(log, a.seq) for a in reversed(appended)]
        await eventually(lambda: caught_up(projector), interval=0.1)
        live = await contents(engine, projector.projection)
    finally:
        projector.stop()
        await asyncio.wait_for(task, 10)
    assert live == before, "a second copy of an event changed the projection"
    assert copies[-1] == await log.stream_last_seq()

    rebuilt = Projector(log, engine, projection_named(name))  # originals and copies in one batch
    await rebuilt.rebuild()
    assert await contents(engine, rebuilt.projection) == live
    assert await rebuilt.behind() == 0, "the checkpoint moved past the copies"


async def test_what_the_copies_would_have_undone_stays_as_the_log_says(
    log: EventLog, engine: AsyncEngine
) -> None:
    """The same, read through the projections' own queries."""
    appended = await log.append_batch(history())
    for a in reversed(appended):
        await resend(log, a.seq)
    for projection in all_projections():
        await Projector(log, engine, projection, catch_up_batch_size=4).catch_up()
    detail = await capability(engine, "slugify")
    assert detail is not None
    # 1.1.0 is other code under the enabled name: it waits for a person (capabilities/pin.py)
    assert (detail.row.version, detail.row.status) == ("1.1.0", "disabled")
    assert [v.version for v in detail.versions] == ["1.0.0", "1.1.0"]
    assert await session_history(engine, "sess-1", exclude_run_id="-") == []  # archived
    async with engine.connect() as conn:
        from nanocrab.projections.audit import audit_invocations, audit_violations
        from nanocrab.projections.sessions import archived_sessions, session_messages

        c2 = (
            await conn.execute(
                select(audit_invocations.c.grant_id, audit_invocations.c.status).where(
                    audit_invocations.c.call_id == "c2"
                )
            )
        ).one()
        assert tuple(c2) == (None, "requested"), "the forged grant stays refused"
        assert len((await conn.execute(select(audit_violations))).all()) == 1
        texts = (await conn.execute(select(session_messages.c.text))).scalars().all()
        assert sorted(texts) == ["and the todo list", "done", "tidy the notes"]
        successor = await conn.scalar(select(archived_sessions.c.next_session_id))
        assert successor == "sess-2", "the first archive stands"


class Breakable:
    """Wraps a projection; its ``apply`` fails with a database-like error until ``fixed``."""

    def __init__(self, inner: RunTimelineProjection) -> None:
        self.inner = inner
        self.name = inner.name
        self.tables = inner.tables
        self.fixed = False

    def subject_filter(self, subjects: Subjects) -> str:
        return self.inner.subject_filter(subjects)

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        if not self.fixed:
            raise RuntimeError("disk I/O error")
        await self.inner.apply(conn, batch)


def run_events(run: str, n: int) -> list[Event]:
    return [ReplySent(text=f"reply {i}", run_id=run, source="t") for i in range(n)]


async def test_status_shows_a_projector_that_cannot_apply_with_its_error_and_lag(
    log: EventLog, engine: AsyncEngine
) -> None:
    await log.append_batch(run_events("run-a", 3))
    breakable = Breakable(RunTimelineProjection())
    projector = Projector(log, engine, breakable, retry_s=0.05, retry_max_s=0.2)
    await projector.setup()
    task = asyncio.create_task(projector.run())

    async def timeline_status() -> dict[str, Any]:
        out = await gather_status(log, engine)
        return next(p for p in out["projections"] if p["name"] == "run_timeline")

    try:

        async def stuck() -> dict[str, Any] | None:
            entry = await timeline_status()
            return entry if entry["error"] and entry["attempts"] >= 2 else None

        entry = await eventually(stuck)
        assert entry["behind"] == 3 and entry["position"] == 0
        assert "disk I/O error" in entry["error"]
        assert task.done() is False, "the projector keeps retrying"
        breakable.fixed = True

        async def recovered() -> dict[str, Any] | None:
            entry = await timeline_status()
            return entry if entry["error"] is None and entry["behind"] == 0 else None

        entry = await eventually(recovered)
        assert entry["position"] == 3
    finally:
        projector.stop()
        await asyncio.wait_for(task, 10)


async def test_a_catch_up_that_cannot_apply_raises_a_projection_error_and_keeps_nothing(
    log: EventLog, engine: AsyncEngine
) -> None:
    await log.append_batch(run_events("run-a", 4))
    projector = Projector(log, engine, Breakable(RunTimelineProjection()))
    with pytest.raises(ProjectionFailed, match="after seq 0: RuntimeError: disk I/O error"):
        await projector.rebuild()
    assert await projector.checkpoint() == 0
    entry = next(p for p in (await gather_status(log, engine))["projections"]
                 if p["name"] == "run_timeline")  # fmt: skip
    assert entry["error"] == "RuntimeError: disk I/O error" and entry["behind"] == 4


async def test_a_table_from_an_older_version_is_rebuilt_from_the_log(
    log: EventLog, engine: AsyncEngine
) -> None:
    """``session_messages`` gained ``event_id``: a database made before that is rebuilt."""
    await log.append_batch([
        TaskSubmitted(text="first", **run_env("run-1", 0)), ReplySent(text="one", **run_env("run-1", 1)),
    ])  # fmt: skip
    old = MetaData()
    Table(
        "session_messages", old,
        Column("seq", BigInteger, primary_key=True, autoincrement=False),
        Column("session_id", String(128), nullable=False),
        Column("run_id", String(128), nullable=False), Column("role", String(16), nullable=False),
        Column("text", Text, nullable=False),
        Column("time", DateTime(timezone=True), nullable=False),
    )  # fmt: skip
    async with engine.begin() as conn:
        await conn.run_sync(old.create_all)
        await conn.run_sync(projection_metadata.create_all, tables=[checkpoints])
        await conn.execute(
            checkpoints.insert().values(name="sessions", stream_seq=2, updated_at=at(0))
        )
    projector = Projector(log, engine, SessionsProjection())
    await projector.setup()
    assert await projector.checkpoint() == 0, "the outdated projection starts over"
    assert await projector.catch_up() == 2
    assert await session_history(engine, "sess-1", exclude_run_id="-") == [
        ("user", "first"), ("assistant", "one"),
    ]  # fmt: skip
