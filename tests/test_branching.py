"""Session branching end to end: a new session forked from an event in the middle of a run sees
exactly the parent's history up to that event (what the model is sent), the parent is unchanged,
branches of branches work, and an unknown event is a clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.branching import BranchError, branches_of, fork_point
from nanocrab.bus import EventLog, read_run
from nanocrab.events import (
    LlmResponded,
    RunCompleted,
    SessionBranched,
    TextBlock,
    ToolCompleted,
    ToolResultBlock,
    ToolUseBlock,
)
from nanocrab.handlers.branches import NOT_RUN
from nanocrab.llm import ModelRequest, ScriptedProvider
from nanocrab.llm.base import Message

from .agent_fixtures import agent_reactors, finished, of_type, running_host, submit

pytestmark = pytest.mark.timeout(90)

SCRIPT = """
scripts:
  - name: reader
    match: "greet"
    turns:
      - text: "Reading."
        tool_calls: [{name: read, input: {path: "greet.py"}}]
      - text: "It greets."
  - name: main
    turns:
      - text: "noted: {task}"
"""


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return demo.make_workspace(tmp_path / "ws")


def spied() -> tuple[ScriptedProvider, dict[tuple[str, int], ModelRequest]]:
    provider = ScriptedProvider.from_text(SCRIPT)
    seen: dict[tuple[str, int], ModelRequest] = {}
    original = provider.complete

    async def spy(request: ModelRequest, **kw: Any) -> Any:
        seen[(request.run_id, request.turn)] = request
        return await original(request, **kw)

    provider.complete = spy  # type: ignore[method-assign]
    return provider, seen


def shape(messages: list[Message]) -> list[tuple[str, list[str]]]:
    """Each message as its role and blocks (texts, tool uses, tool results with their text)."""
    out = []
    for m in messages:
        blocks = []
        for b in m.content:
            if isinstance(b, TextBlock):
                blocks.append(b.text)
            elif isinstance(b, ToolUseBlock):
                blocks.append(f"tool_use {b.name} {b.id}")
            elif isinstance(b, ToolResultBlock):
                text = " ".join(c.text for c in b.content if isinstance(c, TextBlock))
                blocks.append(f"tool_result {b.tool_use_id} error={b.is_error} {text[:40]}")
        out.append((m.role, blocks))
    return out


async def run(log: EventLog, text: str, workspace: Path, session: str) -> str:
    task = submit(text, workspace, session_id=session)
    await log.append(task)
    events = await finished(log, task.run_id or "")
    assert of_type(events, RunCompleted), events[-1]
    return task.run_id or ""


async def branch_at(log: EventLog, target: str, at: str) -> SessionBranched:
    branched = (await fork_point(log, target, at)).branch(by="test")
    await log.append(branched)
    return branched


async def test_a_branch_from_the_middle_of_a_run_sees_the_parent_history_up_to_there(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    provider, seen = spied()
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        first = await run(log, "my name is Ada", workspace, "s-main")
        second = await run(log, "read greet.py please", workspace, "s-main")
        parent_events = [s.event.id for s in await read_run(log, second) if s.event]
        (read,) = of_type([s.event for s in await read_run(log, second)], ToolCompleted)

        # fork between the tool result and the model's next turn, naming the session
        branched = await branch_at(log, "s-main", read.id)
        assert branched.parent_run_id == second and branched.parent_session_id == "s-main"
        assert branched.at_type == "tool.completed"
        on_branch = await run(log, "what did you read?", workspace, branched.session_id or "")

        # the parent goes on as if nothing happened
        third = await run(log, "and now?", workspace, "s-main")

    at_fork = seen[(second, 1)].messages  # what the parent's model saw right after the fork
    call_id = next(b.id for b in at_fork[3].content if isinstance(b, ToolUseBlock))
    assert shape(at_fork)[:4] == [
        ("user", ["my name is Ada"]),
        ("assistant", ["noted: my name is Ada"]),
        ("user", ["read greet.py please"]),
        ("assistant", ["Reading.", f"tool_use read {call_id}"]),
    ]
    ((role, (result,)),) = shape(at_fork[4:])
    assert role == "user" and result.startswith(f"tool_result {call_id} error=False")
    branch_sees = seen[(on_branch, 0)].messages
    assert shape(branch_sees) == [
        *shape(at_fork[:4]),
        ("user", [*shape(at_fork[4:])[0][1], "what did you read?"]),
    ], "exactly the parent's history up to the fork, then the branch's task"
    assert branch_sees[:4] == at_fork[:4] and branch_sees[4].content[:-1] == at_fork[4].content

    assert [t for _, t in shape(seen[(third, 0)].messages)] == [
        ["my name is Ada"], ["noted: my name is Ada"], ["read greet.py please"],
        ["It greets."], ["and now?"],
    ], "the parent's history has nothing of the branch"  # fmt: skip
    assert [s.event.id for s in await read_run(log, second) if s.event] == parent_events
    assert first and [b.id for b in await branches_of(log, {second})] == [branched.id]


async def test_a_branch_of_a_branch_and_a_fork_after_a_tool_call_not_yet_answered(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    provider, seen = spied()
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        parent = await run(log, "read greet.py please", workspace, "s-root")
        (asked, _) = of_type([s.event for s in await read_run(log, parent)], LlmResponded)
        # at the response that asked for the read: its result is not in yet at that event
        one = await branch_at(log, parent, asked.id[-8:])  # a unique suffix names it
        on_one = await run(log, "try again", workspace, one.session_id or "")
        (answer,) = of_type([s.event for s in await read_run(log, on_one)], LlmResponded)
        two = await branch_at(log, on_one, answer.id)
        assert two.parent_session_id == one.session_id
        on_two = await run(log, "and on the second branch?", workspace, two.session_id or "")

    call_id = next(b.id for b in asked.content if isinstance(b, ToolUseBlock))
    not_run = f"tool_result {call_id} error=True {NOT_RUN[:40]}"
    first_branch = [
        ("user", ["read greet.py please"]),
        ("assistant", ["Reading.", f"tool_use read {call_id}"]),
    ]
    assert shape(seen[(on_one, 0)].messages) == [*first_branch, ("user", [not_run, "try again"])]
    assert shape(seen[(on_two, 0)].messages) == [
        *first_branch,
        ("user", [not_run, "try again"]),
        ("assistant", ["noted: try again"]),
        ("user", ["and on the second branch?"]),
    ], "the first branch's shared prefix, its own run up to the fork, then the task"


async def test_an_unknown_event_or_target_is_a_clear_error(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    provider, _ = spied()
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        parent = await run(log, "hello", workspace, "s-x")
    with pytest.raises(BranchError, match=f"run {parent} has no event 'NOPE-NOPE-NOPE'"):
        await fork_point(log, parent, "NOPE-NOPE-NOPE")
    with pytest.raises(BranchError, match="no event 'NOPE-NOPE-NOPE' in session s-x"):
        await fork_point(log, "s-x", "NOPE-NOPE-NOPE")
    with pytest.raises(BranchError, match="neither a run nor a session"):
        await fork_point(log, "no-such-thing", "NOPE-NOPE-NOPE")
    assert await branches_of(log) == []


async def test_a_fork_before_the_guardrails_verdict_still_sees_the_text_only_as_screened(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    from nanocrab.events import GuardrailChecked, TaskSubmitted
    from nanocrab.guardrails import load_guardrails
    from nanocrab.handlers.guardrails import Chain

    provider, seen = spied()
    chain = Chain.of(load_guardrails())
    reactors = agent_reactors(log, engine, provider, workspace, guardrails=chain)
    async with running_host(log, engine, reactors):
        parent = await run(log, "write to alice.smith@acme-corp.com about it", workspace, "s-g")
        events = [s.event for s in await read_run(log, parent)]
        (task,) = of_type(events, TaskSubmitted)
        assert any(v.redacted_text for v in of_type(events, GuardrailChecked))
        # forked at the task itself: its verdict is stored after the fork event
        branched = await branch_at(log, parent, task.id)
        on_branch = await run(log, "who was it?", workspace, branched.session_id or "")
    sent = str(shape(seen[(on_branch, 0)].messages))
    assert "<EMAIL_1>" in sent and "alice.smith@acme-corp.com" not in sent, sent


async def test_a_branch_of_a_session_closed_by_new_still_shares_what_came_before_the_fork(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    """The parent session was archived (``/new``) and a fresh process knows it only from the
    sessions projection (an archive there has no sequence): the fork still shares its past."""
    from nanocrab.events import ReplySent
    from nanocrab.projections import catch_up_projection

    provider, seen = spied()
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        await run(log, "my name is Ada", workspace, "s-old")
        second = await run(log, "I live in Paris", workspace, "s-old")
        await run(log, "/new", workspace, "s-old")
    (reply,) = of_type([s.event for s in await read_run(log, second)], ReplySent)
    await catch_up_projection(log, engine, "sessions")
    branched = await branch_at(log, "s-old", reply.id)
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        on_branch = await run(log, "what is my name?", workspace, branched.session_id or "")
    assert shape(seen[(on_branch, 0)].messages) == [
        ("user", ["my name is Ada"]), ("assistant", ["noted: my name is Ada"]),
        ("user", ["I live in Paris"]), ("assistant", ["noted: I live in Paris"]),
        ("user", ["what is my name?"]),
    ]  # fmt: skip
