"""Audit projection contract, on SQLite and PostgreSQL: real events, the real log, a Projector."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog, Window, read
from nanocrab.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    Capability,
    Event,
    GrantDenied,
    GrantIssued,
    GrantRevoked,
    SecurityRejected,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolSkipped,
    ToolStarted,
)
from nanocrab.projections import (
    AuditProjection,
    AuditRow,
    Projector,
    approval_row,
    audit_rows,
    pending_approvals,
    violations,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACE = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
SIGNER = "UALICEPUBLICKEY"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def env(t: float, run: str = "run-a", **extra: Any) -> dict[str, Any]:
    """Envelope fields of a run's event at ``T0 + t`` seconds."""
    return {
        "run_id": run, "task_id": run, "session_id": f"sess-{run}", "step_id": "step-1",
        "trace": TRACE, "time": at(t), "source": "test", **extra,
    }  # fmt: skip


def requested(call: str, t: float, tool: str = "read", run: str = "run-a") -> ToolRequested:
    return ToolRequested(
        call_id=call, tool=tool, arguments={"path": f"{call}.txt"},
        capabilities=[Capability(tool=tool, resource=f"{call}.txt", access="read")],
        **env(t, run),
    )  # fmt: skip


def grant(call: str, t: float, tool: str = "read", run: str = "run-a", **kw: Any) -> GrantIssued:
    return GrantIssued(
        grant_id=f"g-{call}", call_id=call, tool=tool,
        capabilities=[Capability(tool=tool, resource="/ws")], scope="step",
        tier=kw.pop("tier", "safe"), expires_at=at(t + 600), **env(t, run, source="policy"), **kw,
    )  # fmt: skip


def started(call: str, t: float, tool: str = "read", run: str = "run-a") -> ToolStarted:
    return ToolStarted(
        call_id=call, tool=tool, invocation_id=f"inv-{call}", grant_id=f"g-{call}", **env(t, run)
    )


def completed(call: str, t: float, tool: str = "read", run: str = "run-a", **kw: Any) -> Event:
    return ToolCompleted(call_id=call, tool=tool, **env(t, run), **kw)


def ask(call: str, t: float, tool: str = "exec", expires: float = 300.0) -> ApprovalRequested:
    return ApprovalRequested(
        approval_id=f"appr-{call}", call_id=call, tool=tool, arguments={"command": "make"},
        tier="guarded", reason="runs a command", expires_at=at(t + expires), rule="exec-guarded",
        binding_hash="h" * 64, options=["once", "session"], **env(t),
    )  # fmt: skip


async def project(
    log: EventLog, engine: AsyncEngine, events: list[Event], batch: int = 5000
) -> int:
    await log.append_batch(events)
    projector = Projector(
        log, engine, AuditProjection(), batch_size=batch, catch_up_batch_size=batch
    )
    return await projector.catch_up()


async def by_call(engine: AsyncEngine) -> dict[str, AuditRow]:
    return {r.call_id: r for r in await audit_rows(engine)}


async def test_safe_call_granted_ran_and_completed(log: EventLog, engine: AsyncEngine) -> None:
    await project(
        log,
        engine,
        [
            requested("c1", 0),
            grant("c1", 0.1),
            started("c1", 1.0),
            completed("c1", 1.25, content=[TextBlock("hello")]),
        ],
    )
    (row,) = await audit_rows(engine)
    assert (row.call_id, row.tool, row.status, row.tier) == ("c1", "read", "completed", "safe")
    assert row.trace_id == TRACE_ID
    assert (row.run_id, row.task_id, row.session_id, row.step_id) == (
        "run-a", "run-a", "sess-run-a", "step-1",
    )  # fmt: skip
    assert row.arguments == {"path": "c1.txt"}
    assert row.requested_capabilities == [{"tool": "read", "resource": "c1.txt", "access": "read"}]
    assert row.granted_capabilities == [{"tool": "read", "resource": "/ws", "access": "any"}]
    assert row.grant_id == "g-c1" and not row.approval_required and row.approval_result is None
    assert (row.requested_at, row.start_at, row.end_at) == (at(0), at(1.0), at(1.25))
    assert row.duration_ms == 250.0
    assert row.error is None and not row.revoked


async def test_guarded_call_approved_by_a_human_and_second_answer_ignored(
    log: EventLog, engine: AsyncEngine
) -> None:
    await project(
        log,
        engine,
        [
            requested("c2", 0, tool="exec"),
            ask("c2", 0.1),
            ApprovalGranted(
                approval_id="appr-c2",
                approver="alice",
                remember="session",
                binding_hash="h" * 64,
                signer=SIGNER,
                signature="sig",
                **env(2),
            ),
            ApprovalDenied(approval_id="appr-c2", approver="mallory", reason="no", **env(3)),
            grant("c2", 3.5, tool="exec", tier="guarded", approval_id="appr-c2"),
            started("c2", 4, tool="exec"),
            completed(
                "c2",
                6,
                tool="exec",
                is_error=True,
                error_kind="failed",
                content=[TextBlock("exit status 2: " + "x" * 1000)],
            ),
        ],
    )
    (row,) = await audit_rows(engine)
    assert row.status == "failed" and row.error_kind == "failed"
    assert row.error is not None and row.error.startswith("exit status 2") and len(row.error) == 500
    assert row.approval_required and row.approval_id == "appr-c2"
    assert row.approval_result == "granted"
    assert row.approver == f"alice [{SIGNER}]"
    assert row.tier == "guarded" and row.duration_ms == 2000.0
    approval = await approval_row(engine, "appr-c2")
    assert approval is not None
    assert (approval.status, approval.approver, approval.signer, approval.remember) == (
        "granted", "alice", SIGNER, "session",
    )  # fmt: skip
    assert approval.answered_at == at(2), "the first answer wins; the later denial changes nothing"
    assert (approval.call_id, approval.tool, approval.tier, approval.rule) == (
        "c2", "exec", "guarded", "exec-guarded",
    )  # fmt: skip
    assert approval.arguments == {"command": "make"} and approval.options == ["once", "session"]
    assert approval.expires_at == at(300.1) and approval.requested_at == at(0.1)


async def test_approval_denied_and_approval_expired(log: EventLog, engine: AsyncEngine) -> None:
    await project(
        log,
        engine,
        [
            requested("c3", 0, tool="exec"),
            ask("c3", 0.1),
            ApprovalDenied(
                approval_id="appr-c3", approver="bob", reason="too risky", signer="UBOB", **env(1)
            ),
            requested("c4", 2, tool="exec"),
            ask("c4", 2.1, expires=5),
            ApprovalExpired(approval_id="appr-c4", call_id="c4", **env(7.1)),
            ApprovalGranted(approval_id="appr-c4", approver="late", **env(8)),
        ],
    )
    rows = await by_call(engine)
    assert rows["c3"].status == "denied" and rows["c3"].approval_result == "denied"
    assert rows["c3"].approver == "bob [UBOB]" and rows["c3"].error == "too risky"
    assert rows["c4"].status == "denied" and rows["c4"].approval_result == "expired"
    assert rows["c4"].error == "approval expired" and rows["c4"].approver is None
    expired = await approval_row(engine, "appr-c4")
    assert expired is not None and expired.status == "expired" and expired.approver is None


async def test_revocation_before_its_grant_marks_the_call(
    log: EventLog, engine: AsyncEngine
) -> None:
    # c5: the revocation names only the grant, and is projected in an earlier batch
    await project(log, engine, [requested("c5", 0), GrantRevoked(grant_id="g-c5", reason="policy changed", **env(0.5))])  # fmt: skip
    await project(log, engine, [grant("c5", 0.4), requested("c6", 1)])
    # c6: the revocation names the call; then the grant arrives in the same batch
    await project(
        log,
        engine,
        [GrantRevoked(grant_id="g-c6", call_id="c6", reason="user", **env(1.5)), grant("c6", 1.4)],
    )
    # c1: revoked when the run ended, after it completed: still completed, and no error
    await project(
        log,
        engine,
        [
            requested("c1", 2), grant("c1", 2.1), started("c1", 2.2), completed("c1", 2.3),
            GrantRevoked(grant_id="g-c1", call_id="c1", reason="the run completed", **env(3)),
        ],
    )  # fmt: skip
    rows = await by_call(engine)
    assert rows["c1"].revoked and rows["c1"].status == "completed" and rows["c1"].error is None
    for call in ("c5", "c6"):
        assert rows[call].revoked and rows[call].status == "revoked", call
        assert rows[call].grant_id == f"g-{call}"
        assert rows[call].error is not None and rows[call].error.startswith("grant revoked")


async def test_denied_grant_refusal_skip_and_unknown_calls(
    log: EventLog, engine: AsyncEngine
) -> None:
    await project(
        log,
        engine,
        [
            requested("c7", 0, tool="web_fetch"),
            GrantDenied(
                call_id="c7",
                tool="web_fetch",
                reason="tool 'web_fetch' is not enabled",
                rule="profile",
                **env(0.1, source="policy"),
            ),
            requested("c8", 1),
            grant("c8", 1.1),
            completed(
                "c8",
                1.2,
                is_error=True,
                error_kind="denied",
                content=[TextBlock("refused: grant g-c8 expired")],
            ),
            requested("c9", 2),
            ToolSkipped(call_id="c9", tool="read", reason="steered", **env(2.1)),
            completed("ghost", 3, tool="ls"),  # never requested: still recorded
        ],
    )
    rows = await by_call(engine)
    assert rows["c7"].status == "denied" and rows["c7"].tier == "deny"
    assert rows["c7"].rule == "profile" and rows["c7"].error == "tool 'web_fetch' is not enabled"
    assert rows["c8"].status == "refused" and rows["c8"].error_kind == "denied"
    assert rows["c8"].error == "refused: grant g-c8 expired"
    assert rows["c9"].status == "skipped"
    ghost = rows["ghost"]
    assert (ghost.tool, ghost.status, ghost.run_id, ghost.requested_at) == (
        "ls", "completed", "run-a", at(3),
    )  # fmt: skip


async def test_security_rejected_is_a_violation_and_undoes_a_forged_answer(
    log: EventLog, engine: AsyncEngine
) -> None:
    forged = ApprovalGranted(approval_id="appr-c10", approver="mallory", signer="UEVIL", **env(1))
    await project(log, engine, [requested("c10", 0, tool="exec"), ask("c10", 0.1), forged])
    assert (await by_call(engine))["c10"].approver == "mallory [UEVIL]", "until it is refused"
    await project(
        log,
        engine,
        [
            SecurityRejected(
                rejected_id=forged.id,
                rejected_type="approval.granted",
                reason="signed by UEVIL…, which is not a trusted key",
                call_id="c10",
                approval_id="appr-c10",
                signer="UEVIL",
                **env(1.1, source="policy"),
            ),
        ],
    )
    (v,) = await violations(engine)
    assert (v.rejected_id, v.rejected_type, v.source, v.signer) == (
        forged.id, "approval.granted", "policy", "UEVIL",
    )  # fmt: skip
    assert v.approval_id == "appr-c10" and v.call_id == "c10" and v.run_id == "run-a"
    assert v.time == at(1.1) and "not a trusted key" in v.reason
    row = (await by_call(engine))["c10"]
    assert row.status == "awaiting_approval" and row.approval_result == "pending"
    assert row.approver is None and row.error is not None and "not a trusted key" in row.error
    await project(
        log, engine, [ApprovalGranted(approval_id="appr-c10", approver="alice", **env(2))]
    )
    approval = await approval_row(engine, "appr-c10")
    assert approval is not None and approval.status == "granted" and approval.approver == "alice"
    assert await violations(engine, run_id="run-b") == []
    assert await violations(engine, since=at(1.2)) == []


async def test_audit_rows_filters(log: EventLog, engine: AsyncEngine) -> None:
    await project(
        log,
        engine,
        [
            requested("a1", 0),
            grant("a1", 0.1),
            started("a1", 0.2),
            completed("a1", 0.3),
            requested("a2", 10, tool="exec"),
            ask("a2", 10.1),
            requested("b1", 20, run="run-b"),
            grant("b1", 20.1, run="run-b"),
            started("b1", 20.2, run="run-b"),
            completed("b1", 20.3, run="run-b"),
        ],
    )

    def ids(rows: list[AuditRow]) -> list[str]:
        return [r.call_id for r in rows]

    assert ids(await audit_rows(engine)) == ["a1", "a2", "b1"], "ordered by requested_at"
    assert ids(await audit_rows(engine, run_id="run-a")) == ["a1", "a2"]
    assert ids(await audit_rows(engine, tool="exec")) == ["a2"]
    assert ids(await audit_rows(engine, status="completed")) == ["a1", "b1"]
    assert ids(await audit_rows(engine, status="awaiting_approval")) == ["a2"]
    assert ids(await audit_rows(engine, since=at(5))) == ["a2", "b1"]
    plus_two = timezone(timedelta(hours=2))
    assert ids(await audit_rows(engine, since=at(5).astimezone(plus_two))) == ["a2", "b1"]
    assert ids(await audit_rows(engine, run_id="run-a", status="completed", since=at(5))) == []
    assert ids(await audit_rows(engine, limit=2)) == ["a2", "b1"], "the newest `limit`"


async def test_pending_approvals_and_prefix_lookup(log: EventLog, engine: AsyncEngine) -> None:
    await project(
        log,
        engine,
        [
            ask("p1", 0, expires=100),  # pending
            ask("p2", 1, expires=100),
            ApprovalGranted(approval_id="appr-p2", approver="alice", **env(2)),  # answered
            ask("p3", 3, expires=100),
            ApprovalExpired(approval_id="appr-p3", call_id="p3", **env(4)),  # expired event
            ask("p4", 5, expires=2),  # past its expiry time at `now`
            ApprovalDenied(approval_id="appr-x9", approver="bob", **env(6)),  # never requested
        ],
    )
    pending = await pending_approvals(engine, now=at(50))
    assert [a.approval_id for a in pending] == ["appr-p1"]
    assert pending[0].tool == "exec" and pending[0].status == "pending"
    assert [a.approval_id for a in await pending_approvals(engine, now=at(6))] == [
        "appr-p1", "appr-p4",
    ]  # fmt: skip
    assert await pending_approvals(engine) == [], "all expired by now"
    row = await approval_row(engine, "appr-p3")
    assert row is not None and row.status == "expired"
    assert (await approval_row(engine, "appr-x")) is not None, "unique prefix"
    assert (await approval_row(engine, "appr-p")) is None, "ambiguous prefix"
    assert (await approval_row(engine, "appr_p%")) is None, "wildcards are literal"
    assert (await approval_row(engine, "")) is None
    orphan = await approval_row(engine, "appr-x9")
    assert orphan is not None and orphan.status == "denied" and orphan.requested_at is None


async def table_contents(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    async with engine.connect() as conn:
        for table in AuditProjection.tables:
            result = await conn.execute(select(table).order_by(*table.primary_key.columns))
            out[table.name] = [tuple(r) for r in result]
    return out


async def test_rebuild_gives_identical_rows(log: EventLog, engine: AsyncEngine) -> None:
    forged = ApprovalGranted(approval_id="appr-r2", approver="mallory", **env(3))
    events: list[Event] = [
        requested("r1", 0), grant("r1", 0.1), started("r1", 0.2), completed("r1", 0.3),
        requested("r2", 1, tool="exec"), ask("r2", 1.1), forged,
        SecurityRejected(
            rejected_id=forged.id, rejected_type="approval.granted", reason="bad signature",
            approval_id="appr-r2", call_id="r2", **env(3.1),
        ),
        ApprovalGranted(approval_id="appr-r2", approver="alice", signer=SIGNER, **env(4)),
        grant("r2", 4.1, tool="exec", tier="guarded", approval_id="appr-r2"),
        GrantRevoked(grant_id="g-r3", reason="gone", **env(5)),
        requested("r3", 4.5), grant("r3", 4.6),
        ask("r4", 6), ApprovalExpired(approval_id="appr-r4", call_id="r4", **env(7)),
        requested("r5", 8), GrantDenied(call_id="r5", tool="read", reason="no", **env(8.1)),
        grant("r6", 9, remembered=True, tier="guarded"), started("r6", 9.1),
    ]  # fmt: skip
    assert await project(log, engine, events) == len(events)
    once = await table_contents(engine)
    assert {k: len(v) for k, v in once.items()} == {
        "audit_invocations": 6, "audit_approvals": 2, "audit_violations": 1,
        "audit_revocations": 1, "audit_applied_events": len(events), "audit_budgets": 0,
    }  # fmt: skip
    r6 = (await by_call(engine))["r6"]
    assert r6.approval_result == "remembered" and r6.approval_required and r6.status == "running"
    rebuilt = Projector(log, engine, AuditProjection(), batch_size=2, catch_up_batch_size=2)
    assert await rebuilt.rebuild() == len(events)
    assert await table_contents(engine) == once, "batch boundaries do not change the rows"


async def test_events_the_audit_ignores_cost_no_transaction_but_the_position_is_kept(
    log: EventLog, sqlite_engine: AsyncEngine
) -> None:
    from nanocrab.events import LlmRequested
    from nanocrab.projections import checkpoints

    async def stored_checkpoint() -> int:
        async with sqlite_engine.connect() as conn:
            rows = (await conn.execute(checkpoints.select())).mappings().all()
        return next((int(r["stream_seq"]) for r in rows if r["name"] == "audit"), 0)

    await log.append_batch([LlmRequested(turn=i, **env(i)) for i in range(20)])
    last = await log.stream_last_seq()
    projector = Projector(log, sqlite_engine, AuditProjection(), batch_size=5)
    await projector.setup()
    for start in range(0, 20, 5):  # what the live loop does, batch by batch
        batch = [
            s async for s in read(log, log.subjects.run("run-a"), Window(start + 1, start + 5))
        ]
        assert await projector.apply_batch(batch) == 0
    assert projector.position == last
    assert await stored_checkpoint() < last, "ignored events wrote nothing yet (lazy)"
    await projector.flush_checkpoint()
    assert await stored_checkpoint() == last
    await log.append(requested("c1", 30))
    assert await projector.catch_up() == 1  # the next relevant event is applied once
    assert set(await by_call(sqlite_engine)) == {"c1"}
