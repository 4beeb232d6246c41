"""Two runs whose tool calls share an id never share an audit row (issue 10, bug 5).

Call ids come from the model provider; one that numbers its calls per run (``call_0``) repeats
them in every run, and the policy derives the approval and grant ids from the call id, so those
repeat too. Each run must keep its own call, grant, approval, revocation and violation, on
SQLite and PostgreSQL, whatever the batch boundaries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, Table, insert, inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog
from nanocrab.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Capability,
    Event,
    GrantDenied,
    GrantIssued,
    GrantRevoked,
    LlmRequested,
    LlmResponded,
    SecurityRejected,
    ToolCompleted,
    ToolRequested,
    ToolStarted,
    ToolUseBlock,
)
from nanocrab.policy import Policy
from nanocrab.projections import (
    AuditProjection,
    Projector,
    approval_row,
    audit_rows,
    checkpoints,
    pending_approvals,
    violations,
)
from nanocrab.projections.audit import audit_invocations
from nanocrab.projections.db import metadata
from tests.conftest import eventually
from tests.security_rig import Rig, security_rig

from .test_audit_projection import at, env, table_contents

CALL = "call_0"  # what a provider numbering calls per run gives the first call of every run
APPROVAL = f"appr-{CALL}"  # the policy derives it from the call id alone
GRANT = f"g-{CALL}"


WRITES_GUARDED = Policy.from_mapping(
    {
        "version": 1, "grant_ttl": 60, "approval": {"timeout": 30},
        "rules": [{"id": "write-ws", "tools": ["write"], "paths": ["${workspace}"],
                   "tier": "guarded"}],
    },
    source="call-ids",
)  # fmt: skip
"""A ``write`` in the workspace asks a person."""


def requested(run: str, t: float, tool: str = "exec") -> ToolRequested:
    return ToolRequested(
        call_id=CALL, tool=tool, arguments={"command": f"make {run}"},
        capabilities=[Capability(tool=tool, resource=f"/ws/{run}", access="execute")],
        **env(t, run),
    )  # fmt: skip


def ask(run: str, t: float) -> ApprovalRequested:
    return ApprovalRequested(
        approval_id=APPROVAL, call_id=CALL, tool="exec", arguments={"command": f"make {run}"},
        tier="guarded", reason="runs a command", expires_at=at(t + 300), rule="exec-guarded",
        binding_hash=run * 8, options=["once", "session"], **env(t, run, source="policy"),
    )  # fmt: skip


def grant(run: str, t: float, **kw: Any) -> GrantIssued:
    return GrantIssued(
        grant_id=GRANT, call_id=CALL, tool="exec", scope="step", tier="guarded",
        capabilities=[Capability(tool="exec", resource=f"/ws/{run}")], expires_at=at(t + 600),
        **env(t, run, source="policy"), **kw,
    )  # fmt: skip


def two_runs() -> list[Event]:
    """run-a: asked, approved by alice, granted, ran, completed, its grant revoked at the run's
    end (naming the grant only). run-b, later, with the same ids: a forged answer refused, then
    denied by bob."""
    forged = ApprovalGranted(approval_id=APPROVAL, approver="mallory", **env(11, "run-b"))
    return [
        requested("run-a", 0),
        ask("run-a", 0.1),
        ApprovalGranted(
            approval_id=APPROVAL,
            approver="alice",
            signer="UALICE",
            binding_hash="run-a" * 8,
            **env(1, "run-a"),
        ),
        grant("run-a", 1.1, approval_id=APPROVAL),
        ToolStarted(
            call_id=CALL, tool="exec", invocation_id="inv-a", grant_id=GRANT, **env(2, "run-a")
        ),
        ToolCompleted(call_id=CALL, tool="exec", **env(3, "run-a")),
        GrantRevoked(grant_id=GRANT, reason="the run completed", **env(4, "run-a")),
        requested("run-b", 10),
        ask("run-b", 10.1),
        forged,
        SecurityRejected(
            rejected_id=forged.id,
            rejected_type="approval.granted",
            reason="untrusted key",
            call_id=CALL,
            approval_id=APPROVAL,
            signer="UEVIL",
            **env(11.1, "run-b"),
        ),
        ApprovalDenied(
            approval_id=APPROVAL,
            approver="bob",
            reason="not today",
            signer="UBOB",
            **env(12, "run-b"),
        ),
        GrantDenied(
            call_id=CALL,
            tool="exec",
            reason="denied by bob: not today",
            tier="guarded",
            approval_id=APPROVAL,
            **env(12.1, "run-b", source="policy"),
        ),
    ]


async def project(log: EventLog, engine: AsyncEngine, events: list[Event], batch: int) -> int:
    await log.append_batch(events)
    projector = Projector(
        log, engine, AuditProjection(), batch_size=batch, catch_up_batch_size=batch
    )
    return await projector.catch_up()


@pytest.mark.parametrize("batch", [5000, 1])
async def test_two_runs_with_the_same_call_id_keep_their_own_rows(
    log: EventLog, engine: AsyncEngine, batch: int
) -> None:
    events = two_runs()
    assert await project(log, engine, events, batch) == len(events)
    rows = await audit_rows(engine, call_id=CALL)
    assert [(r.run_id, r.call_id) for r in rows] == [("run-a", CALL), ("run-b", CALL)]
    a, b = rows
    assert (a.status, a.approval_result, a.approver) == ("completed", "granted", "alice [UALICE]")
    assert a.arguments == {"command": "make run-a"} and a.grant_id == GRANT
    assert a.granted_capabilities == [{"tool": "exec", "resource": "/ws/run-a", "access": "any"}]
    assert a.revoked and a.error is None, "revoked after it completed: not an error"
    assert (a.approval_id, a.approval_run_id) == (APPROVAL, "run-a")
    assert (a.requested_at, a.start_at, a.end_at) == (at(0), at(2), at(3))

    assert (b.status, b.approval_result, b.approver) == ("denied", "denied", "bob [UBOB]")
    assert b.arguments == {"command": "make run-b"} and b.grant_id is None and not b.revoked
    assert b.granted_capabilities == [] and b.start_at is None and b.end_at is None
    assert (b.approval_id, b.approval_run_id) == (APPROVAL, "run-b")
    assert b.error == "denied by bob: not today" and b.requested_at == at(10)

    assert [r.run_id for r in await audit_rows(engine, run_id="run-b")] == ["run-b"]
    (v,) = await violations(engine)
    assert (v.run_id, v.call_id, v.approval_id) == ("run-b", CALL, APPROVAL)

    contents = await table_contents(engine)
    assert {k: len(v) for k, v in contents.items() if k != "audit_applied_events"} == {
        "audit_invocations": 2, "audit_approvals": 2, "audit_violations": 1,
        "audit_revocations": 1, "audit_budgets": 0,
    }  # fmt: skip
    rebuilt = Projector(log, engine, AuditProjection(), batch_size=3, catch_up_batch_size=3)
    assert await rebuilt.rebuild() == len(events)
    assert await table_contents(engine) == contents, "batch boundaries do not change the rows"


async def test_each_run_answers_its_own_approval(log: EventLog, engine: AsyncEngine) -> None:
    """run-a's approval is granted; run-b's, with the same id, still waits for a human, and
    ``nanocrab approve ID`` finds that one (the only pending one of that id)."""
    events: list[Event] = [
        requested("run-a", 0), ask("run-a", 0.1),
        ApprovalGranted(approval_id=APPROVAL, approver="alice", **env(1, "run-a")),
        requested("run-b", 10), ask("run-b", 10.1),
    ]  # fmt: skip
    await project(log, engine, events, 1)
    a, b = await audit_rows(engine, call_id=CALL)
    assert (a.run_id, a.status, a.approval_result) == ("run-a", "granted", "granted")
    assert (b.run_id, b.status, b.approval_result) == ("run-b", "awaiting_approval", "pending")
    (pending,) = await pending_approvals(engine, now=at(20))
    assert (pending.run_id, pending.approval_id, pending.status) == ("run-b", APPROVAL, "pending")
    found = await approval_row(engine, APPROVAL)
    assert found is not None and found.run_id == "run-b"
    assert (await approval_row(engine, "appr-call")) == found, "a prefix finds it too"
    await project(
        log, engine, [ApprovalDenied(approval_id=APPROVAL, approver="bob", **env(11, "run-b"))], 1
    )
    assert await approval_row(engine, APPROVAL) is None, "two answered: ambiguous"


async def test_a_remembered_grant_points_to_the_run_that_was_asked(
    log: EventLog, engine: AsyncEngine
) -> None:
    """A session approval given in run-a covers run-c's call (same call id, as the provider
    numbers per run): run-c's row shows who approved, and run-a's row stays run-a's."""
    events: list[Event] = [
        requested("run-a", 0), ask("run-a", 0.1),
        ApprovalGranted(
            approval_id=APPROVAL, approver="alice", remember="session", **env(1, "run-a")
        ),
        grant("run-a", 1.1, approval_id=APPROVAL),
        ToolCompleted(call_id=CALL, tool="exec", **env(2, "run-a")),
    ]  # fmt: skip
    await project(log, engine, events, 5000)
    await project(
        log,
        engine,
        [
            requested("run-c", 20),
            grant("run-c", 20.1, approval_id=APPROVAL, remembered=True),
        ],
        5000,
    )
    a, c = await audit_rows(engine, call_id=CALL)
    assert (a.run_id, a.status, a.approval_result) == ("run-a", "completed", "granted")
    assert (c.run_id, c.status, c.approval_result) == ("run-c", "granted", "remembered")
    assert (c.approval_id, c.approval_run_id, c.approver) == (APPROVAL, "run-a", "alice")
    assert c.arguments == {"command": "make run-c"}


def schema_before() -> MetaData:
    """The audit tables as they were: each keyed by its id alone, no ``approval_run_id``, no
    ``run_id`` in ``audit_revocations``."""
    old = MetaData()
    keys = {"audit_invocations": "call_id", "audit_approvals": "approval_id",
            "audit_revocations": "grant_id", "audit_violations": "id",
            "audit_applied_events": "event_id"}  # fmt: skip
    for table in AuditProjection.tables:
        if table.name not in keys:
            continue  # a table added since (audit_budgets): the rebuild creates it
        dropped = {"approval_run_id"} | ({"run_id"} if table.name == "audit_revocations" else set())
        Table(
            table.name,
            old,
            *(
                Column(c.name, c.type, primary_key=c.name == keys[table.name])
                for c in table.c
                if c.name not in dropped
            ),
        )
    return old


async def test_an_audit_keyed_by_call_id_alone_is_rebuilt(
    log: EventLog, engine: AsyncEngine
) -> None:
    """Tables from before (an id alone the key), checkpointed at the end of the log with the
    two runs merged into one row, are dropped and rebuilt from the log on start."""
    events = two_runs()
    await log.append_batch(events)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all, tables=[checkpoints])
        await conn.run_sync(schema_before().create_all)
        row: dict[str, Any] = {
            c.name: None for c in audit_invocations.c if c.name != "approval_run_id"
        }
        row.update(
            call_id=CALL, run_id="run-a", requested_at=at(0), status="denied",
            requested_capabilities="[]", granted_capabilities="[]", approval_required=True,
            grant_denied=True, remembered=False, revoked=True,
        )  # fmt: skip
        await conn.execute(text("DELETE FROM audit_invocations"))
        await conn.execute(
            text(
                f"INSERT INTO audit_invocations ({', '.join(row)}) "
                f"VALUES ({', '.join(':' + k for k in row)})"
            ),
            row,
        )
        await conn.execute(
            insert(checkpoints).values(
                name="audit", stream_seq=await log.stream_last_seq(), updated_at=at(0)
            )
        )
    projector = Projector(log, engine, AuditProjection())
    assert await projector.catch_up() == len(events), "rebuilt from the start of the log"
    async with engine.connect() as conn:
        key = await conn.run_sync(lambda sync: inspect(sync).get_pk_constraint("audit_invocations"))
    assert set(key["constrained_columns"]) == {"call_id", "run_id"}
    rows = await audit_rows(engine, call_id=CALL)
    assert [(r.run_id, r.status) for r in rows] == [("run-a", "completed"), ("run-b", "denied")]


# --- through the real policy and executor ---------------------------------------------------


async def call_with_id(
    rig: Rig, run_id: str, call_id: str, tool: str, args: dict[str, Any]
) -> None:
    """A model turn asking for one tool call under ``call_id`` (as a provider numbering its
    calls per run gives it), and the orchestrator's request for it."""
    turn = rig.turns[run_id]
    rig.turns[run_id] = turn + 1
    sid = (await rig.task(run_id)).session_id
    common: dict[str, Any] = {"run_id": run_id, "task_id": run_id, "session_id": sid}
    await rig.log.append_batch(
        [
            LlmRequested(turn=turn, source="orchestrator", **common),
            LlmResponded(
                provider="scripted", model="m", stop_reason="tool_use", turn=turn,
                content=[ToolUseBlock(id=call_id, name=tool, input=args)], source="llm",
                **common,
            ),
            ToolRequested(call_id=call_id, tool=tool, arguments=args, source="orchestrator", **common),
        ]
    )  # fmt: skip


async def test_the_policy_and_executor_audit_each_run_on_its_own(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    """Two runs, one guarded ``write`` each, both ``call_0``: the first approved and run, the
    second refused by the approver; each audit row has its own grant, approval and outcome."""
    async with security_rig(log, engine, tmp_path, WRITES_GUARDED) as rig:
        first = await rig.start_run()
        await call_with_id(rig, first, CALL, "write", {"path": "one.txt", "content": "1"})
        await rig.log.append(rig.answer(await rig.approval(first, CALL)))
        assert isinstance(await rig.outcome(first, CALL), ToolCompleted)
        await rig.audit(CALL, lambda r: r.run_id == first and r.status == "completed")

        second = await rig.start_run()
        await call_with_id(rig, second, CALL, "write", {"path": "two.txt", "content": "2"})
        await rig.log.append(rig.answer(await rig.approval(second, CALL), grant=False))
        assert isinstance(await rig.outcome(second, CALL), GrantDenied)
        b = await rig.audit(CALL, lambda r: r.run_id == second and r.status == "denied")

        a, b2 = await audit_rows(engine, call_id=CALL)
        assert (a.run_id, b2) == (first, b)
        assert (a.status, a.approval_result) == ("completed", "granted")
        assert a.approver is not None and a.approver.startswith("approver [U")
        assert a.arguments == {"path": "one.txt", "content": "1"} and a.grant_id
        assert (b.approval_result, b.approver, b.grant_id) == ("denied", a.approver, None)
        assert b.arguments == {"path": "two.txt", "content": "2"}
        assert (rig.workspace / "one.txt").exists() and not (rig.workspace / "two.txt").exists()


async def test_two_pending_calls_with_the_same_call_id_have_their_own_approval_ids(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    """An approval id names one run's call: derived from its ``tool.requested``, not from the
    call id the model chose. An adversarial pass (7) pressed Approve on one chat's Telegram
    message and approved another chat's Unsafe call with the same call id (a compromised
    ``llm`` reusing it); by id alone, ``approval_row`` could not tell the two apart either."""
    async with security_rig(log, engine, tmp_path, WRITES_GUARDED) as rig:
        first, second = await rig.start_run(), await rig.start_run()
        await call_with_id(rig, first, CALL, "write", {"path": "one.txt", "content": "1"})
        await call_with_id(rig, second, CALL, "write", {"path": "two.txt", "content": "2"})
        a, b = await rig.approval(first, CALL), await rig.approval(second, CALL)
        assert a.approval_id != b.approval_id
        assert not a.approval_id.startswith("0000000000")  # a time, like any event id

        async def listed() -> bool:
            ids = {p.approval_id for p in await pending_approvals(engine)}
            return {a.approval_id, b.approval_id} <= ids

        await eventually(listed)
        row = await approval_row(engine, b.approval_id, prefix=False)
        assert row is not None and row.run_id == second
        await rig.log.append(rig.answer(b))
        assert isinstance(await rig.outcome(second, CALL), ToolCompleted)
        assert (rig.workspace / "two.txt").exists() and not (rig.workspace / "one.txt").exists()
