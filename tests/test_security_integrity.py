"""The log's integrity, end to end through the real policy handler, executor and audit.

Three guarantees (issue 9, items 2 to 4), each case asserting what was refused or contained *and*
what the audit says:

- every grant, Safe included, is bound to its call, and the executor runs exactly the model's
  call (the ``tool_use`` of ``llm.responded``), whatever ``tool.requested`` events say;
- an event stored on another subject than its own (a forged type on an identity's own subject)
  is believed by no reader: not the run state, not replay, not projections; it is reported;
- no side effect runs twice: a call whose ``tool.started`` has no completion is reported
  ``interrupted`` after a crash (a real ``kill -9`` of an executor process), never re-run,
  unless its tool is idempotent.

The tools here are counting stand-ins for ``write`` and ``read``: every invocation leaves a line
in a file, so "ran once", "never ran" and "ran twice" are facts on disk, not log readings.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from pydantic import Field
from rich.console import Console
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import (
    Connector,
    Delivery,
    EventLog,
    PublishRefused,
    TransientError,
    read,
    read_run,
)
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.bus.placement import Misplaced
from nanocrab.cli.host import Host
from nanocrab.cli.render import event_line, stored_json, timeline_table
from nanocrab.events import (
    ApprovalGranted,
    ApprovalRequested,
    BusMalformed,
    Event,
    GrantDenied,
    GrantIssued,
    GrantRevoked,
    LlmRequested,
    LlmResponded,
    RunCompleted,
    RunStarted,
    SecurityRejected,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolResolved,
    ToolResultBlock,
    ToolStarted,
    ToolUseBlock,
    derive_event_id,
    new_event_id,
    utcnow,
)
from nanocrab.handlers.conversation import messages
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.orchestrator.decide import decide
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.handlers.runloader import RunLoader
from nanocrab.handlers.runstate import RunState, fold
from nanocrab.policy import Policy
from nanocrab.projections import (
    AuditProjection,
    Projector,
    RunTimelineProjection,
    run_timeline,
    violations,
)
from nanocrab.security import KeyRing, binding_hash, sign
from nanocrab.tools import LocalOperations
from nanocrab.tools.base import ToolArgs, ToolContext, ToolResult
from nanocrab.tools.registry import ToolRegistry
from tests.agent_fixtures import FAST
from tests.conftest import eventually
from tests.security_rig import Rig
from tests.test_broker_permissions import bus, secured  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parents[1]
ACK_WAIT_S = 1.5  # the doomed executor's consumer: a dead instance's grant comes back quickly
POLICY = Policy.from_mapping(
    {
        "version": 1,
        "grant_ttl": 60,
        "approval": {"timeout": 30},
        "rules": [
            {"id": "read-ws", "tools": ["read"], "paths": ["${workspace}"], "tier": "safe"},
            {"id": "write-guarded", "tools": ["write"], "paths": ["${workspace}/guarded"],
             "tier": "guarded"},
            {"id": "write-ws", "tools": ["write"], "paths": ["${workspace}"], "tier": "safe"},
        ],
    },
    source="integrity-policy",
)  # fmt: skip


# --- counting tools ----------------------------------------------------------------------------


class WriteArgs(ToolArgs):
    path: str = Field(description="File to append to, relative to the workspace.")
    content: str = Field(description="One line to append.")


class CountingWrite:
    """A write with a side effect to count: appends ``content`` as a line to ``path``, then
    waits for ``release`` (``hang``: forever, like a command that never returns)."""

    name: ClassVar[str] = "write"
    group: ClassVar[str] = "files"
    description: ClassVar[str] = "Append one line to a file (test stand-in for write)."
    args_model: ClassVar[type[ToolArgs]] = WriteArgs
    idempotent: ClassVar[bool] = False

    def __init__(self, *, hang: bool = False, release: asyncio.Event | None = None) -> None:
        self.hang = hang
        self.release = release

    async def run(self, args: WriteArgs, ctx: ToolContext) -> ToolResult:
        target = ctx.workspace / args.path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as f:
            f.write(args.content + "\n")
        if self.hang:
            await asyncio.Event().wait()
        if self.release is not None:
            await self.release.wait()
        return ToolResult.text(f"appended to {args.path}")


class ReadArgs(ToolArgs):
    path: str = Field(description="File to read, relative to the workspace.")


class CountingRead:
    """An idempotent read that logs every invocation to ``reads.log``; with ``hang_first`` the
    first invocation ever (one line in the log) never returns."""

    name: ClassVar[str] = "read"
    group: ClassVar[str] = "files"
    description: ClassVar[str] = "Read a file (test stand-in for read)."
    args_model: ClassVar[type[ToolArgs]] = ReadArgs
    idempotent: ClassVar[bool] = True

    def __init__(self, *, hang_first: bool = False) -> None:
        self.hang_first = hang_first

    async def run(self, args: ReadArgs, ctx: ToolContext) -> ToolResult:
        with (ctx.workspace / "reads.log").open("a") as f:
            f.write(args.path + "\n")
        if self.hang_first and lines(ctx.workspace / "reads.log") == [args.path]:
            await asyncio.Event().wait()
        return ToolResult.text((ctx.workspace / args.path).read_text())


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def make_executor(log: EventLog, keys: KeyRing, workspace: Path, tools: Sequence[Any]) -> Executor:
    return Executor(
        log, registry=ToolRegistry(tools), ops=LocalOperations(),
        artifacts=JetStreamArtifacts(log), default_workspace=workspace, tool_timeout_s=60,
        trusted_policy=frozenset({keys.public_key("policy")}),
        trusted_approvers=trusted_approvers(POLICY, keys),
    )  # fmt: skip


# --- the rig: policy + audit always, the executor when the case says ------------------------


@dataclass
class Case:
    rig: Rig
    tools: list[Any]

    @property
    def log(self) -> EventLog:
        return self.rig.log

    @contextlib.asynccontextmanager
    async def executor(
        self, tools: Sequence[Any] | None = None, log: EventLog | None = None
    ) -> AsyncIterator[Executor]:
        executor = make_executor(
            log or self.log, self.rig.keys, self.rig.workspace, tools or self.tools
        )
        host = Host(log or self.log, self.rig.engine, [executor], projections=[], options=FAST)
        await host.start()
        try:
            yield executor
        finally:
            await host.stop(drain_s=1)


@contextlib.asynccontextmanager
async def case_rig(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, *, executor: bool, tools: list[Any]
) -> AsyncIterator[Case]:
    workspace = (tmp_path / "ws").resolve()
    workspace.mkdir(exist_ok=True)
    keys = KeyRing(tmp_path / "keys")
    handler = PolicyHandler(
        log, policy=POLICY, keys=keys, known_tools=frozenset({"read", "write"}),
        default_workspace=workspace, watch_interval_s=0.05,
    )  # fmt: skip
    reactors: list[Any] = [handler]
    if executor:
        reactors.append(make_executor(log, keys, workspace, tools))
    host = Host(log, engine, reactors, projections=[AuditProjection()], options=FAST)
    await host.start()
    try:
        yield Case(Rig(log, engine, keys, workspace, POLICY, host=host, handler=handler), tools)
    finally:
        await host.stop(drain_s=5)


@pytest.fixture
async def late(log, sqlite_engine, tmp_path: Path) -> AsyncIterator[Case]:  # type: ignore[no-untyped-def]
    """Policy and audit running; the executor starts when the case says (``case.executor()``)."""
    async with case_rig(
        log, sqlite_engine, tmp_path, executor=False, tools=[CountingWrite(), CountingRead()]
    ) as c:
        yield c


@pytest.fixture
async def full(log, sqlite_engine, tmp_path: Path) -> AsyncIterator[Case]:  # type: ignore[no-untyped-def]
    async with case_rig(
        log, sqlite_engine, tmp_path, executor=True, tools=[CountingWrite(), CountingRead()]
    ) as c:
        yield c


async def envelope(rig: Rig, run: str) -> dict[str, Any]:
    task = await rig.task(run)
    return {"run_id": run, "task_id": run, "session_id": task.session_id}


def own_subject(log: EventLog, run: str, event_type: str) -> str:
    """The subject an identity may publish ``event_type`` of ``run`` on."""
    return f"{log.cfg.root}.default.run.{run}.{event_type}"


async def forge(log: EventLog, subject: str, claimed: Event) -> int:
    """Store ``claimed`` on ``subject`` as a raw publish does (the broker checks the subject
    only); returns its stream sequence."""
    payload = log.codec.encode(claimed, subject=subject)
    ack = await log.js.publish(subject, payload, headers={"Nats-Msg-Id": claimed.id})
    return int(ack.seq)


async def turn(
    rig: Rig, run: str, tool: str, model_args: dict[str, Any], requested: dict[str, Any] | None
) -> str:
    """A model turn asking for one call and, unless ``requested`` is None, a ``tool.requested``
    with ``requested`` as its arguments (the orchestrator's identity may publish it)."""
    index = rig.turns[run]
    rig.turns[run] = index + 1
    call = f"toolu_{new_event_id()}"
    env = await envelope(rig, run)
    events: list[Event] = [
        LlmRequested(turn=index, source="orchestrator", **env),
        LlmResponded(
            provider="scripted", model="m", stop_reason="tool_use", turn=index, source="llm",
            content=[ToolUseBlock(id=call, name=tool, input=model_args)], **env,
        ),
    ]  # fmt: skip
    if requested is not None:
        events.append(
            ToolRequested(
                call_id=call, tool=tool, arguments=requested, source="orchestrator", **env
            )
        )
    await rig.log.append_batch(events)
    return call


async def reported(rig: Rig, run: str, rejected_id: str) -> SecurityRejected:
    return await rig.wait(run, SecurityRejected, lambda e: e.rejected_id == rejected_id)


async def started(rig: Rig, run: str, call: str) -> list[ToolStarted]:
    return [e for e in await rig.events(run) if isinstance(e, ToolStarted) and e.call_id == call]


async def completed(rig: Rig, run: str, call: str) -> ToolCompleted:
    """The executor's result of ``call`` (not a ``tool.resolved``, a subclass)."""
    return await rig.wait(
        run, ToolCompleted, lambda e: e.call_id == call and not isinstance(e, ToolResolved)
    )


# --- item 3: the llm/cli exploit, Safe tier ------------------------------------------------------


@pytest.mark.parametrize("carrier", ["llm.responded", "message.queued"])
async def test_a_forged_request_on_an_identity_s_own_subject_does_not_swap_a_granted_call(
    late: Case, carrier: str
) -> None:
    """The reported exploit: after the policy granted ``real``, the ``llm`` (or ``cli``)
    identity stores a ``tool.requested`` for the same call with new arguments on its own
    subject. The executor runs the model's call, and the forgery is reported."""
    rig = late.rig
    run = await rig.start_run()
    call = await rig.call(run, "write", {"path": "notes.txt", "content": "real"})
    grant = await rig.wait(run, GrantIssued, lambda e: e.call_id == call)
    assert grant.tier == "safe"
    forged = ToolRequested(
        call_id=call, tool="write", arguments={"path": "notes.txt", "content": "forged"},
        source="orchestrator", **await envelope(rig, run),
    )  # fmt: skip
    seq = await forge(rig.log, own_subject(rig.log, run, carrier), forged)
    async with late.executor():
        outcome = await completed(rig, run, call)
        report = await reported(rig, run, forged.id)
    assert not outcome.is_error, outcome
    assert lines(rig.workspace / "notes.txt") == ["real"], "only the model's call ran, once"
    assert report.reason.startswith("misplaced:") and carrier in report.reason
    assert report.call_id == call and report.rejected_type == "tool.requested"
    row = await rig.audit(call, lambda r: r.status == "completed")
    assert row.arguments == {"path": "notes.txt", "content": "real"}
    assert row.error and "misplaced" in row.error
    (stored,) = [s for s in await read_run(rig.log, run) if s.seq == seq]
    assert stored.event is None and isinstance(stored.error, Misplaced)


# --- item 3: forged types on every identity's own subjects --------------------------------------


Forgery = Callable[[Rig, str, str, ApprovalRequested, dict[str, Any]], Event]


def _request(rig: Rig, run: str, call: str, req: ApprovalRequested, env: dict[str, Any]) -> Event:
    args = {"path": "guarded/out.txt", "content": "forged"}
    return ToolRequested(call_id=call, tool="write", arguments=args, source="orchestrator", **env)


def _fake_result(rig: Rig, run: str, call: str, req: ApprovalRequested, env: dict[str, Any]) -> Event:  # fmt: skip
    return ToolCompleted(
        call_id=call, tool="write", content=[TextBlock("done (not really)")], source="executor",
        **env,
    )  # fmt: skip


def _grant(rig: Rig, run: str, call: str, req: ApprovalRequested, env: dict[str, Any]) -> Event:
    """A grant signed with the real policy key (as if it leaked), bound to other arguments."""
    nonce = "0" * 32
    args = {"path": "guarded/out.txt", "content": "forged"}
    grant = GrantIssued(
        grant_id=f"forged-{call}", call_id=call, tool="write", capabilities=[], scope="step",
        tier="safe", expires_at=utcnow() + timedelta(minutes=5), source="policy",
        binding_hash=binding_hash("write", args, [], nonce), nonce=nonce, **env,
    )  # fmt: skip
    return sign(grant, rig.keys.keypair("policy"))


def _approval(rig: Rig, run: str, call: str, req: ApprovalRequested, env: dict[str, Any]) -> Event:
    """A genuine-looking answer signed by the trusted approver key for this very request."""
    return rig.answer(req)


def _denial(rig: Rig, run: str, call: str, req: ApprovalRequested, env: dict[str, Any]) -> Event:
    return GrantDenied(call_id=call, tool="write", reason="forged denial", source="policy", **env)


def _revocation(rig: Rig, run: str, call: str, req: ApprovalRequested, env: dict[str, Any]) -> Event:  # fmt: skip
    grant_id = derive_event_id("grant", call, 0)
    return GrantRevoked(grant_id=grant_id, call_id=call, reason="forged", source="policy", **env)


def _run_end(rig: Rig, run: str, call: str, req: ApprovalRequested, env: dict[str, Any]) -> Event:
    return RunCompleted(reply="over", source="orchestrator", **env)


def _other_run(rig: Rig, run: str, call: str, req: ApprovalRequested, env: dict[str, Any]) -> Event:  # fmt: skip
    """A tool.completed of this call whose envelope names another run (the id token differs)."""
    return _fake_result(rig, run, call, req, {**env, "run_id": new_event_id()})


@pytest.mark.parametrize(
    ("identity", "carrier", "claim"),
    [
        ("llm", "llm.responded", _request),
        ("cli", "message.queued", _request),
        ("executor", "tool.completed", _request),
        ("executor", "tool.started", _fake_result),
        ("executor", "tool.completed", _grant),
        ("approver", "approval.granted", _grant),
        ("orchestrator", "tool.requested", _approval),
        ("orchestrator", "run.started", _denial),
        ("cli", "message.queued", _revocation),
        ("llm", "llm.failed", _run_end),
        ("executor", "tool.completed", _other_run),
    ],
    ids=lambda v: v if isinstance(v, str) else v.__name__.strip("_"),
)
async def test_a_forged_type_on_an_identity_s_own_subject_changes_nothing(
    full: Case, identity: str, carrier: str, claim: Forgery
) -> None:
    """Each forgery, if believed, would run other arguments, fake the result, block or deny
    the call, revoke its grant or end the run. Stored on a subject the identity may publish,
    it is ignored: after the real approval the model's call runs once, and the forgery is
    reported."""
    rig = full.rig
    run = await rig.start_run()
    call = await rig.call(run, "write", {"path": "guarded/out.txt", "content": "real"})
    request = await rig.approval(run, call)
    forged = claim(rig, run, call, request, await envelope(rig, run))
    seq = await forge(rig.log, own_subject(rig.log, run, carrier), forged)
    await rig.log.append(rig.answer(request))
    outcome = await completed(rig, run, call)
    assert not outcome.is_error, f"{identity} on {carrier}: {outcome}"
    assert lines(rig.workspace / "guarded" / "out.txt") == ["real"]
    assert len(await started(rig, run, call)) == 1
    report = await reported(rig, run, forged.id)
    assert report.reason.startswith("misplaced:") and report.rejected_type == forged.type
    row = await rig.audit(call, lambda r: r.status == "completed")
    assert row.approval_result == "granted" and row.arguments == {
        "path": "guarded/out.txt", "content": "real"
    }  # fmt: skip
    found = await eventually(lambda: violations(rig.engine, run_id=run))
    assert forged.id in {v.rejected_id for v in found}
    assert isinstance((await rig.log.get(seq)).data, bytes)
    with pytest.raises(Misplaced):
        await rig.log.read(seq)


async def test_a_handler_dead_letters_a_misplaced_event_on_a_subject_it_consumes(
    full: Case,
) -> None:
    """The approver identity stores a (policy-signed) grant on ``approval.granted``: the policy
    handler, which consumes that subject, records a dead letter naming both subjects."""
    rig = full.rig
    run = await rig.start_run()
    call = await rig.call(run, "write", {"path": "guarded/x.txt", "content": "real"})
    request = await rig.approval(run, call)
    forged = _grant(rig, run, call, request, await envelope(rig, run))
    seq = await forge(rig.log, own_subject(rig.log, run, "approval.granted"), forged)

    async def letter() -> BusMalformed | None:
        async for s in read(rig.log, f"{rig.log.cfg.root}.*.system.*.bus.malformed"):
            if isinstance(s.event, BusMalformed) and s.event.stream_seq == seq:
                return s.event
        return None

    dead = await eventually(letter)
    assert dead.handler == "policy" and dead.reason_kind == "invalid"
    assert dead.reason.startswith("misplaced:") and "approval.granted" in dead.reason
    assert not (rig.workspace / "guarded" / "x.txt").exists()
    await rig.audit(call, lambda r: r.status == "awaiting_approval" and r.grant_id is None)


# --- item 3: the orchestrator's own tool.requested must be the model's call --------------------


async def test_a_request_with_other_arguments_than_the_model_s_call_never_runs(
    full: Case,
) -> None:
    """The orchestrator identity may publish tool.requested; one that does not repeat the
    model's tool_use is not the call. The policy does not decide on it (no grant, no approval
    to ask anyone for) and reports it; nothing runs."""
    rig = full.rig
    run = await rig.start_run()
    call = await turn(
        rig, run, "write", {"path": "a.txt", "content": "real"},
        {"path": "a.txt", "content": "forged"},
    )  # fmt: skip
    (forged,) = [e for e in await rig.events(run) if isinstance(e, ToolRequested)]
    report = await reported(rig, run, forged.id)
    assert "other arguments than the model's call" in report.reason
    assert report.source == "policy"
    events = await rig.events(run)
    assert not [e for e in events if isinstance(e, GrantIssued | ApprovalRequested)]
    assert not (rig.workspace / "a.txt").exists(), "neither the forged nor the real call ran"
    assert not await started(rig, run, call)
    state = await RunLoader(rig.log).state(run)
    assert state.call(call).requested is None  # type: ignore[union-attr]
    assert [r.event.id for r in state.rejected] == [forged.id]
    found = await eventually(lambda: _violations_of(rig, run, forged.id))
    assert found, "the audit lists the forged request among the violations"


async def _violations_of(rig: Rig, run: str, rejected_id: str) -> list[object]:
    return [v for v in await violations(rig.engine, run_id=run) if v.rejected_id == rejected_id]


async def test_a_second_request_for_a_call_never_replaces_the_first(full: Case) -> None:
    rig = full.rig
    run = await rig.start_run()
    call = await rig.call(run, "write", {"path": "guarded/b.txt", "content": "real"})
    request = await rig.approval(run, call)
    second = ToolRequested(
        call_id=call, tool="write", arguments={"path": "guarded/b.txt", "content": "forged"},
        source="orchestrator", **await envelope(rig, run),
    )  # fmt: skip
    await rig.log.append(second)
    await rig.log.append(rig.answer(request))
    assert not (await completed(rig, run, call)).is_error
    assert lines(rig.workspace / "guarded" / "b.txt") == ["real"]
    report = await reported(rig, run, second.id)
    assert "a second request" in report.reason and report.call_id == call
    row = await rig.audit(call, lambda r: r.status == "completed")
    assert row.arguments == {"path": "guarded/b.txt", "content": "real"}, "the first stands"


async def test_a_request_for_a_call_the_model_never_made_is_refused(full: Case) -> None:
    rig = full.rig
    run = await rig.start_run()
    call = await turn(rig, run, "write", {"path": "c.txt", "content": "real"}, None)
    ghost = f"toolu_{new_event_id()}"
    await rig.log.append(
        ToolRequested(
            call_id=ghost, tool="write", arguments={"path": "c.txt", "content": "ghost"},
            source="orchestrator", **await envelope(rig, run),
        )
    )  # fmt: skip
    report = await rig.wait(run, SecurityRejected)
    assert "asked for no call" in report.reason and report.source == "policy"
    events = await rig.events(run)
    assert not [e for e in events if isinstance(e, GrantIssued) and e.call_id == ghost]
    assert not (rig.workspace / "c.txt").exists()
    assert await eventually(lambda: _violations_of(rig, run, report.rejected_id))
    del call


# --- item 2: every grant, Safe included, is bound to its call ----------------------------------


async def test_the_policy_binds_a_safe_grant_to_its_call(full: Case) -> None:
    rig = full.rig
    run = await rig.start_run()
    args = {"path": "d.txt", "content": "real"}
    call = await rig.call(run, "write", args)
    grant = await rig.wait(run, GrantIssued, lambda e: e.call_id == call)
    assert grant.tier == "safe" and grant.nonce and len(grant.nonce) == 32
    resources = [c.resource for c in grant.capabilities]
    assert grant.binding_hash == binding_hash("write", args, resources, grant.nonce)
    assert not (await completed(rig, run, call)).is_error
    await rig.audit(call, lambda r: r.status == "completed" and r.tier == "safe")


async def safe_grant(rig: Rig, run: str, call: str, **changes: Any) -> GrantIssued:
    """A Safe grant for ``call`` signed with the real policy key, then changed (pre-signing)."""
    fields: dict[str, Any] = {
        "grant_id": derive_event_id("grant", call, 0), "call_id": call, "tool": "write",
        "capabilities": [], "scope": "step", "tier": "safe",
        "expires_at": utcnow() + timedelta(minutes=5), "source": "policy",
        **await envelope(rig, run), **changes,
    }  # fmt: skip
    return sign(GrantIssued(**fields), rig.keys.keypair("policy"))


@pytest.mark.parametrize(
    ("binding", "why"),
    [
        ({}, "is not bound to the call"),
        ({"binding_hash": "ab" * 32, "nonce": "1" * 32}, "bound to other arguments"),
        (
            {"binding_hash": binding_hash(
                "write", {"path": "guarded/e.txt", "content": "other"}, [], "2" * 32
            ), "nonce": "2" * 32},
            "bound to other arguments",
        ),
    ],
    ids=["unbound", "garbage-hash", "other-arguments"],
)  # fmt: skip
async def test_a_safe_grant_not_bound_to_exactly_this_call_is_refused(
    full: Case, binding: dict[str, Any], why: str
) -> None:
    """Signed by the real policy key (a leaked key, or a policy bug), Safe, for the right call:
    still refused unless its binding is the call's own."""
    rig = full.rig
    run = await rig.start_run()
    call = await rig.call(run, "write", {"path": "guarded/e.txt", "content": "real"})
    await rig.approval(run, call)  # Guarded: the policy itself issues nothing yet
    await rig.log.append(await safe_grant(rig, run, call, **binding))
    outcome = await completed(rig, run, call)
    assert outcome.error_kind == "denied" and why in outcome.content[0].text  # type: ignore[union-attr]
    assert not (rig.workspace / "guarded" / "e.txt").exists()
    row = await rig.audit(call, lambda r: r.status == "refused")
    assert row.error and why in row.error


async def test_a_safe_grant_replayed_for_another_call_is_rejected(full: Case) -> None:
    rig = full.rig
    run = await rig.start_run()
    first = await rig.call(run, "write", {"path": "f.txt", "content": "first"})
    grant = await rig.wait(run, GrantIssued, lambda e: e.call_id == first)
    await completed(rig, run, first)
    second = await rig.call(run, "write", {"path": "guarded/f.txt", "content": "second"})
    await rig.approval(run, second)
    moved = msgspec.structs.replace(grant, call_id=second, id=new_event_id())
    await rig.log.append(moved)
    rejected = await rig.wait(run, SecurityRejected, lambda e: e.rejected_id == moved.id)
    assert "invalid signature" in rejected.reason
    assert not (rig.workspace / "guarded" / "f.txt").exists()
    await rig.audit(second, lambda r: r.status == "awaiting_approval" and bool(r.error))


async def test_a_grant_stored_again_under_a_new_id_runs_nothing_more(
    log, sqlite_engine, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The same signed grant appended again (a replay) while the call runs and after it
    completed: one invocation, one result."""
    release = asyncio.Event()
    tools = [CountingWrite(release=release), CountingRead()]
    async with case_rig(log, sqlite_engine, tmp_path, executor=True, tools=tools) as case:
        rig = case.rig
        run = await rig.start_run()
        call = await rig.call(run, "write", {"path": "g.txt", "content": "once"})
        grant = await rig.wait(run, GrantIssued, lambda e: e.call_id == call)
        await rig.wait(run, ToolStarted, lambda e: e.call_id == call)
        await rig.log.append(msgspec.structs.replace(grant, id=new_event_id()))  # while running
        release.set()
        await completed(rig, run, call)
        await rig.log.append(msgspec.structs.replace(grant, id=new_event_id()))  # after
        await rig.audit(call, lambda r: r.status == "completed")
        last = await rig.log.stream_last_seq()
        await eventually(lambda: _consumed(rig.log, "executor", last))
    assert lines(rig.workspace / "g.txt") == ["once"]
    events = await rig.events(run)
    assert len([e for e in events if isinstance(e, ToolStarted)]) == 1
    assert len([e for e in events if isinstance(e, ToolCompleted)]) == 1


async def _consumed(log: EventLog, durable: str, seq: int) -> bool:
    info = await log.js.consumer_info(log.cfg.log_stream, durable)
    return info.ack_floor.stream_seq >= seq and info.num_ack_pending == 0


# --- item 3: read paths: replay, render, projections, point reads, loaders ---------------------


async def test_replay_and_timelines_show_a_misplaced_event_as_rejected(late: Case) -> None:
    rig = late.rig
    run = await rig.start_run()
    ghost = ToolRequested(
        call_id="toolu_ghost", tool="write", arguments={"path": "x", "content": "x"},
        source="orchestrator", **await envelope(rig, run),
    )  # fmt: skip
    seq = await forge(rig.log, own_subject(rig.log, run, "llm.responded"), ghost)
    stored = [s for s in await read_run(rig.log, run) if s.seq == seq]
    assert len(stored) == 1 and stored[0].event is None
    error = stored[0].error
    assert isinstance(error, Misplaced) and error.event.id == ghost.id
    assert f"{rig.log.cfg.root}.default.run.{run}.tool.requested" in str(error)
    line = event_line(stored[0]).plain
    assert line.strip().startswith(f"{seq} rejected on ") and "llm.responded" in line
    assert stored_json(stored[0])["error"]["kind"] == "misplaced"
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(timeline_table(run, stored))
    assert "rejected" in console.export_text() and "undecodable" not in console.export_text()
    with pytest.raises(Misplaced):
        await rig.log.read(seq)
    state = await RunLoader(rig.log).state(run)
    assert [r.seq for r in state.rejected] == [seq] and ghost not in state.events


async def test_projections_skip_a_misplaced_event_and_move_past_it(late: Case) -> None:
    rig = late.rig
    run = await rig.start_run()
    call = await rig.call(run, "write", {"path": "guarded/h.txt", "content": "real"})
    await rig.approval(run, call)
    ghost = ToolRequested(
        call_id="toolu_ghost", tool="write", arguments={"path": "x", "content": "x"},
        source="orchestrator", **await envelope(rig, run),
    )  # fmt: skip
    seq = await forge(rig.log, own_subject(rig.log, run, "llm.responded"), ghost)
    after = await rig.log.append(RunStarted(source="orchestrator", **await envelope(rig, run)))
    timeline = Projector(rig.log, rig.engine, RunTimelineProjection())
    await timeline.catch_up()
    assert await timeline.checkpoint() >= after.seq > seq
    async with rig.engine.connect() as conn:
        ids = set((await conn.execute(select(run_timeline.c.event_id))).scalars())
        seqs = set((await conn.execute(select(run_timeline.c.seq))).scalars())
    assert ghost.id not in ids and seq not in seqs and after.event_id in ids
    assert rig.host is not None
    audit = rig.host.projectors[0]
    await eventually(lambda: audit.position >= seq)
    from nanocrab.projections import audit_rows

    assert "toolu_ghost" not in {r.call_id for r in await audit_rows(rig.engine)}


async def test_the_broker_lets_llm_store_a_misplaced_event_and_nothing_believes_it(
    bus: Connector,  # noqa: F811
    sqlite_engine: AsyncEngine,
    tmp_path: Path,
) -> None:
    """On a server with broker permissions, every part on its own identity: ``llm`` may not
    publish ``tool.requested`` but can store one on its own ``llm.responded`` subject. The
    policy, executor and audit run as themselves and none of them believes it."""
    logs = await bus.open_all(["admin", "policy", "executor", "projector", "llm", "cli",
                               "orchestrator", "approver"])  # fmt: skip
    keys = KeyRing(bus.cfg.keys_dir)
    workspace = (tmp_path / "ws").resolve()
    workspace.mkdir()
    handler = PolicyHandler(
        logs("policy"), policy=POLICY, keys=keys, known_tools=frozenset({"read", "write"}),
        default_workspace=workspace, watch_interval_s=0.05,
    )  # fmt: skip
    executor = make_executor(logs("executor"), keys, workspace, [CountingWrite(), CountingRead()])
    host = Host(logs("admin"), sqlite_engine, [handler, executor],
                projections=[AuditProjection()], options=FAST, log_for=logs)  # fmt: skip
    await host.start()
    try:
        run, call = new_event_id(), f"toolu_{new_event_id()}"
        env: dict[str, Any] = {"run_id": run, "task_id": run, "session_id": "s1"}
        args = {"path": "guarded/i.txt", "content": "real"}
        await logs("cli").append(TaskSubmitted(text="t", workspace=str(workspace), **env))
        orchestrator = logs("orchestrator")
        await orchestrator.append_batch([RunStarted(source="orchestrator", **env),
                                         LlmRequested(turn=0, source="orchestrator", **env)])  # fmt: skip
        await logs("llm").append(
            LlmResponded(provider="scripted", model="m", stop_reason="tool_use", turn=0,
                         content=[ToolUseBlock(id=call, name="write", input=args)],
                         source="llm", **env)
        )  # fmt: skip
        await orchestrator.append(
            ToolRequested(call_id=call, tool="write", arguments=args, source="orchestrator", **env)
        )
        admin = logs("admin")

        async def request() -> ApprovalRequested | None:
            return next(
                (s.event for s in await read_run(admin, run)
                 if isinstance(s.event, ApprovalRequested)), None,
            )  # fmt: skip

        approval = await eventually(request)
        forged = ToolRequested(call_id=call, tool="write", source="orchestrator",
                               arguments={"path": "guarded/i.txt", "content": "forged"}, **env)  # fmt: skip
        llm = logs("llm")
        with pytest.raises(PublishRefused):
            await llm.append(forged)  # on its own subject the broker refuses it
        seq = await forge(llm, own_subject(llm, run, "llm.responded"), forged)  # accepted
        answer = sign(
            ApprovalGranted(approval_id=approval.approval_id, approver="approver",
                            binding_hash=approval.binding_hash, source="approver", **env),
            keys.keypair("approver"),
        )  # fmt: skip
        await logs("approver").append(answer)

        async def outcome() -> ToolCompleted | None:
            return next(
                (s.event for s in await read_run(admin, run)
                 if isinstance(s.event, ToolCompleted)), None,
            )  # fmt: skip

        done = await eventually(outcome)
        assert not done.is_error, done
        assert lines(workspace / "guarded" / "i.txt") == ["real"]
        stored = {s.seq: s for s in await read_run(logs("projector"), run)}
        assert isinstance(stored[seq].error, Misplaced)
        assert any(
            isinstance(s.event, SecurityRejected) and s.event.rejected_id == forged.id
            and s.event.source == "executor"
            for s in stored.values()
        )  # fmt: skip
    finally:
        await host.stop(drain_s=5)


# --- item 4: no side effect runs twice ----------------------------------------------------------

DOOMED_EXECUTOR = """
import asyncio, sys
from pathlib import Path
from nanocrab.bus import BusConfig, EventLog, HandlerRuntime, RuntimeOptions, connect
from nanocrab.security import KeyRing
from tests.test_security_integrity import ACK_WAIT_S, CountingRead, CountingWrite, make_executor

async def main(url: str, root: str, home: str, workspace: str) -> None:
    cfg = BusConfig(url=url, data_dir=Path(home), root=root)
    log = await EventLog.open(await connect(url, name="doomed-executor"), cfg)
    tools = [CountingWrite(hang=True), CountingRead(hang_first=True)]
    executor = make_executor(log, KeyRing(Path(home) / "keys"), Path(workspace), tools)
    options = RuntimeOptions(ack_wait_s=ACK_WAIT_S, fetch_timeout_s=0.5, concurrency=4)
    await HandlerRuntime(log, executor, options=options).run()

asyncio.run(main(*sys.argv[1:]))
"""


@contextlib.asynccontextmanager
async def doomed_executor(log: EventLog, tmp_path: Path, workspace: Path) -> AsyncIterator[int]:
    """An executor in a process of its own, to be killed with SIGKILL; yields its pid."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DOOMED_EXECUTOR, str(log.cfg.url), log.cfg.root, str(tmp_path),
        str(workspace), cwd=REPO, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc.pid
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()


def kill_9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


async def test_kill_9_mid_write_then_a_fresh_executor_reports_interrupted(late: Case) -> None:
    """``kill -9`` of the executor process while a write-like tool runs; the grant comes back
    to a fresh executor, which does not run the tool again."""
    rig = late.rig
    run = await rig.start_run()
    call = await rig.call(run, "write", {"path": "k.txt", "content": "side effect"})
    async with doomed_executor(rig.log, rig.workspace.parent, rig.workspace) as pid:
        await rig.wait(run, ToolStarted, lambda e: e.call_id == call, timeout=30)
        await eventually(lambda: lines(rig.workspace / "k.txt") != [])
        kill_9(pid)
    async with late.executor():
        outcome = await completed(rig, run, call)
    assert outcome.is_error and outcome.error_kind == "interrupted", outcome
    text = outcome.content[0].text  # type: ignore[union-attr]
    assert "effects are unknown" in text and "not run again" in text
    assert lines(rig.workspace / "k.txt") == ["side effect"], "the side effect ran once"
    assert len(await started(rig, run, call)) == 1
    row = await rig.audit(call, lambda r: r.status == "failed")
    assert row.error_kind == "interrupted" and row.error and "interrupted" in row.error


async def test_kill_9_mid_read_then_the_idempotent_read_is_retried(late: Case) -> None:
    rig = late.rig
    (rig.workspace / "notes.txt").write_text("hello\n")
    run = await rig.start_run()
    call = await rig.call(run, "read", {"path": "notes.txt"})
    async with doomed_executor(rig.log, rig.workspace.parent, rig.workspace) as pid:
        await rig.wait(run, ToolStarted, lambda e: e.call_id == call, timeout=30)
        await eventually(lambda: lines(rig.workspace / "reads.log") != [])
        kill_9(pid)
    async with late.executor():
        outcome = await completed(rig, run, call)
    assert not outcome.is_error and outcome.content[0].text == "hello\n"  # type: ignore[union-attr]
    assert lines(rig.workspace / "reads.log") == ["notes.txt", "notes.txt"], "run again"
    starts = await started(rig, run, call)
    assert len(starts) == 2 and starts[0].invocation_id != starts[1].invocation_id
    await rig.audit(call, lambda r: r.status == "completed")


async def test_a_start_without_completion_in_the_log_is_interrupted_on_first_delivery(
    late: Case,
) -> None:
    """The log says an invocation started (its executor died before the grant was acked);
    a fresh executor's first delivery of the grant must not run it."""
    rig = late.rig
    run = await rig.start_run()
    call = await rig.call(run, "write", {"path": "m.txt", "content": "x"})
    grant = await rig.wait(run, GrantIssued, lambda e: e.call_id == call)
    await rig.log.append(
        ToolStarted(call_id=call, tool="write", invocation_id="earlier", grant_id=grant.grant_id,
                    source="executor", causation_id=grant.id, **await envelope(rig, run))
    )  # fmt: skip
    async with late.executor():
        outcome = await completed(rig, run, call)
    assert outcome.error_kind == "interrupted"
    assert not (rig.workspace / "m.txt").exists(), "never run by this executor"
    await rig.audit(call, lambda r: r.status == "failed" and r.error_kind == "interrupted")


async def test_a_redelivery_while_the_call_runs_here_waits_for_it(
    log, sqlite_engine, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The same grant delivered again (ack wait passed, connection lost) while this process
    still runs the tool: the redelivery neither re-runs it nor reports it interrupted."""
    release = asyncio.Event()
    tools = [CountingWrite(release=release), CountingRead()]
    async with case_rig(log, sqlite_engine, tmp_path, executor=True, tools=tools) as case:
        rig = case.rig
        assert rig.host is not None
        executor = next(r for r in rig.host.reactors if isinstance(r, Executor))
        run = await rig.start_run()
        call = await rig.call(run, "write", {"path": "n.txt", "content": "once"})
        grant = await rig.wait(run, GrantIssued, lambda e: e.call_id == call)
        await rig.wait(run, ToolStarted, lambda e: e.call_id == call)
        subject = rig.log.subjects.for_event(grant)
        again = asyncio.create_task(executor.handle(grant, Delivery(0, subject, 2)))
        await asyncio.sleep(0)
        assert not again.done()
        release.set()
        assert await asyncio.wait_for(again, 10) == []
        outcome = await completed(rig, run, call)
        await rig.audit(call, lambda r: r.status == "completed")
    assert not outcome.is_error
    assert lines(rig.workspace / "n.txt") == ["once"]
    events = await rig.events(run)
    assert [e.error_kind for e in events if isinstance(e, ToolCompleted)] == [None]
    assert len([e for e in events if isinstance(e, ToolStarted)]) == 1


async def test_two_instances_given_one_grant_at_once_run_the_call_once(
    late: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two executor instances handle the same grant at once (redelivered while the first still
    works, as when a consumer's leader moves), the second having read the run before the first
    started the call: only the first runs it; the second leaves it alone to be redelivered."""
    rig = late.rig
    release = asyncio.Event()
    tools = [CountingWrite(release=release), CountingRead()]
    first = make_executor(rig.log, rig.keys, rig.workspace, tools)
    second = make_executor(rig.log, rig.keys, rig.workspace, tools)
    run = await rig.start_run()
    call = await rig.call(run, "write", {"path": "o.txt", "content": "once"})
    grant = await rig.wait(run, GrantIssued, lambda e: e.call_id == call)
    before_the_start = await second.loader.state(run)

    async def stale(run_id: str) -> RunState:
        return before_the_start

    monkeypatch.setattr(second.loader, "state", stale)
    subject = rig.log.subjects.for_event(grant)
    running = asyncio.create_task(first.handle(grant, Delivery(0, subject, 1)))
    await rig.wait(run, ToolStarted, lambda e: e.call_id == call)
    with pytest.raises(TransientError, match="stored already"):
        await second.handle(grant, Delivery(0, subject, 2))
    assert lines(rig.workspace / "o.txt") == ["once"], "the second instance ran nothing"
    release.set()
    assert await asyncio.wait_for(running, 10) == []
    outcome = await completed(rig, run, call)
    assert not outcome.is_error, outcome
    assert lines(rig.workspace / "o.txt") == ["once"]
    assert len(await started(rig, run, call)) == 1


def test_the_model_sees_an_interrupted_call_as_a_failed_tool_result() -> None:
    run = "r1"
    env: dict[str, Any] = {"run_id": run}
    events: list[Event] = [
        TaskSubmitted(text="t", **env), RunStarted(**env), LlmRequested(turn=0, **env),
        LlmResponded(provider="p", model="m", stop_reason="tool_use", turn=0, **env,
                     content=[ToolUseBlock(id="c1", name="write", input={"path": "a"})]),
        ToolRequested(call_id="c1", tool="write", arguments={"path": "a"}, **env),
        ToolCompleted(call_id="c1", tool="write", is_error=True, error_kind="interrupted",
                      content=[TextBlock("interrupted: effects unknown")], **env),
    ]  # fmt: skip
    state = fold(run, list(enumerate(events, 1)))
    (next_turn,) = decide(state, utcnow())
    assert next_turn.type == "llm.requested"
    state.apply(next_turn, len(events) + 1)
    results = [b for m in messages(state) for b in m.content if isinstance(b, ToolResultBlock)]
    assert len(results) == 1 and results[0].is_error
    assert "interrupted" in results[0].content[0].text  # type: ignore[union-attr]
