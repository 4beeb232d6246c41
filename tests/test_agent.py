"""The agent loop end to end on a real nats-server and SQLite: every step an event."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
from collections import Counter
from pathlib import Path

import msgspec
import psutil
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import EventLog, HandlerRuntime, read_run
from nanocrab.events import (
    ContextCompacted,
    Event,
    GrantDenied,
    GrantIssued,
    LlmFailed,
    LlmRequested,
    LlmResponded,
    MessageQueued,
    ReplySent,
    RunCancelled,
    RunCompleted,
    RunFailed,
    SecurityRejected,
    SubagentCompleted,
    SubagentSpawned,
    TaskSubmitted,
    ToolCompleted,
    ToolRequested,
    ToolSkipped,
    ToolStarted,
    ToolUseBlock,
    utcnow,
)
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.llm import ReplayProvider, ScriptedProvider

from .agent_fixtures import FAST, agent_reactors, finished, of_type, running_host, submit
from .conftest import eventually


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return demo.make_workspace(tmp_path / "ws")


def scripted(yaml_text: str) -> ScriptedProvider:
    return ScriptedProvider.from_text(yaml_text)


def assert_no_duplicate_steps(events: list[Event]) -> None:
    requests = Counter(e.turn for e in of_type(events, LlmRequested))
    assert all(n == 1 for n in requests.values()), f"a turn was requested twice: {requests}"
    tools = Counter(e.call_id for e in of_type(events, ToolRequested))
    assert all(n == 1 for n in tools.values()), f"a tool call was requested twice: {tools}"
    done = Counter(e.call_id for e in of_type(events, ToolCompleted))
    assert all(n == 1 for n in done.values()), f"a tool ran twice: {done}"
    assert len(of_type(events, RunCompleted)) + len(of_type(events, RunFailed)) == 1


async def test_the_demo_task_runs_end_to_end(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    provider = ScriptedProvider.from_yaml(demo.SCRIPT)
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        task = submit(demo.TASK, workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
    assert_no_duplicate_steps(events)
    completed = of_type(events, ToolCompleted)
    assert [c.tool for c in completed] == ["skill", "ls", "read", "read", "edit", "exec"]
    assert not any(c.is_error for c in completed), [c.content for c in completed if c.is_error]
    assert 'return f"Hello, {name}!"' in (workspace / "greet.py").read_text()
    exec_result = completed[-1]
    assert exec_result.details is not None and exec_result.details.exit_code == 0  # type: ignore[union-attr]
    edit = completed[4]
    assert '+    return f"Hello, {name}!"' in edit.details.diff  # type: ignore[union-attr]
    assert len(of_type(events, GrantIssued)) == 6 and len(of_type(events, ToolStarted)) == 6
    (run_completed,) = of_type(events, RunCompleted)
    assert "passes" in run_completed.reply and run_completed.steps == 5
    usage = [r.usage for r in of_type(events, LlmResponded)]
    assert len(usage) == 5 and all(u.input_tokens > 0 for u in usage)


TWO_TOOLS = """
scripts:
  - name: main
    turns:
      - tool_calls: [{name: ls, input: {path: "."}}, {name: read, input: {path: README.md}}]
      - tool_calls: [{name: read, input: {path: greet.py}}]
      - text: "finished"
"""


async def test_an_orchestrator_killed_mid_run_and_restarted_makes_no_duplicate_step(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    reactors = agent_reactors(log, engine, scripted(TWO_TOOLS), workspace, orchestrators=())
    async with running_host(log, engine, reactors):
        task = submit("look around", workspace)
        first = HandlerRuntime(log, Orchestrator(log), options=FAST)
        crashed = asyncio.create_task(first.run())
        await log.append(task)

        async def first_tool_done() -> bool:
            return bool(
                of_type([s.event for s in await read_run(log, task.run_id or "")], ToolCompleted)
            )

        await eventually(first_tool_done)
        crashed.cancel()  # killed, not stopped: whatever it was doing is cut off
        first.stop()  # Python 3.11's wait_for can swallow a cancel (bpo-42130); then it just ends
        await asyncio.gather(crashed, return_exceptions=True)
        second = HandlerRuntime(log, Orchestrator(log), options=FAST)
        resumed = asyncio.create_task(second.run())
        try:
            events = await finished(log, task.run_id or "")
        finally:
            second.stop()
            await resumed
    assert_no_duplicate_steps(events)
    assert of_type(events, RunCompleted)[0].reply == "finished"
    assert len(of_type(events, ToolCompleted)) == 3


async def test_two_orchestrators_on_one_stream_never_decide_twice(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    # two *separate* durables: each instance sees every event and races the other to decide
    reactors = agent_reactors(log, engine, scripted(TWO_TOOLS), workspace,
                              orchestrators=("orchestrator-a", "orchestrator-b"))  # fmt: skip
    async with running_host(log, engine, reactors) as host:
        tasks = [submit(f"look around {i}", workspace) for i in range(4)]
        await log.append_batch(tasks)
        for task in tasks:
            events = await finished(log, task.run_id or "")
            assert_no_duplicate_steps(events)
        superseded = sum(rt.superseded for rt in host.runtimes if rt.durable.startswith("orch"))
    assert superseded > 0, "the race happened and the guard dropped the losing decisions"


# an exec that ends only once the test creates ``go`` in the workspace (no race with the clock)
WAIT_FOR_GO = "python3 -c 'import os, time\nwhile not os.path.exists(\"go\"): time.sleep(0.02)'"
WAIT_SLOW = json.dumps(f"{WAIT_FOR_GO}; echo slow")
WAIT_FIRST = json.dumps(f"{WAIT_FOR_GO}; echo first")

STEER = """
scripts:
  - name: main
    turns:
      - tool_calls:
          - {name: exec, input: {command: WAIT_SLOW}}
          - {name: read, input: {path: greet.py}}
          - {name: read, input: {path: README.md}}
      - text: "Looked at test_greet.py as asked."
""".replace("WAIT_SLOW", WAIT_SLOW)


async def test_steer_skips_the_remaining_calls(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    async with running_host(log, engine, agent_reactors(log, engine, scripted(STEER), workspace)):
        task = submit("inspect", workspace)
        await log.append(task)

        async def exec_started() -> bool:
            return bool(
                of_type([s.event for s in await read_run(log, task.run_id or "")], ToolStarted)
            )

        await eventually(exec_started)
        steer = MessageQueued(
            mode="steer", text="look at test_greet.py instead", run_id=task.run_id
        )
        await log.append(steer)
        (workspace / "go").touch()  # the exec ends only once the steer is in the log
        events = await finished(log, task.run_id or "")
    assert [c.tool for c in of_type(events, ToolCompleted)] == ["exec"], "the current call finished"
    skipped = of_type(events, ToolSkipped)
    assert [(s.tool, s.reason) for s in skipped] == [("read", "steered"), ("read", "steered")]
    second = of_type(events, LlmRequested)[1]
    assert second.delivers == [steer.id]
    assert of_type(events, RunCompleted)


FOLLOW = """
scripts:
  - name: main
    turns:
      - tool_calls: [{name: exec, input: {command: WAIT_FIRST}}]
      - text: "first answer"
      - text: "answer to the follow-up"
""".replace("WAIT_FIRST", WAIT_FIRST)


async def test_follow_up_runs_after_the_turn(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    async with running_host(log, engine, agent_reactors(log, engine, scripted(FOLLOW), workspace)):
        task = submit("do it", workspace)
        await log.append(task)
        follow = MessageQueued(mode="follow_up", text="and one more thing", run_id=task.run_id)
        await log.append(follow)
        (workspace / "go").touch()  # the turn ends only once the follow-up is in the log
        events = await finished(log, task.run_id or "")
    assert [r.text for r in of_type(events, ReplySent)] == [
        "first answer",
        "answer to the follow-up",
    ]
    requests = of_type(events, LlmRequested)
    assert [r.delivers for r in requests] == [[], [], [follow.id]]
    assert not of_type(events, ToolSkipped), "a follow-up never interrupts"


SPAWN = """
scripts:
  - name: child
    match: "^find where"
    turns:
      - tool_calls: [{name: grep, input: {pattern: "def greet"}}]
      - text: "greet is defined in greet.py, line 4"
  - name: parent
    turns:
      - tool_calls: [{name: spawn, input: {task: "find where greet is defined", tools: [grep, read, exec]}}]
      - text: "The subagent says: greet.py line 4"
"""


async def test_a_subagent_result_reaches_its_parent(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    async with running_host(log, engine, agent_reactors(log, engine, scripted(SPAWN), workspace)):
        task = submit("delegate the search", workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
        (spawned,) = of_type(events, SubagentSpawned)
        child = [s.event for s in await read_run(log, spawned.child_run_id)]
    (child_task,) = of_type(child, TaskSubmitted)
    assert child_task.parent_run_id == task.run_id and child_task.tools == ["read", "grep"]
    assert [c.tool for c in of_type(child, ToolCompleted)] == ["grep"]
    (back,) = [c for c in of_type(events, ToolCompleted) if c.tool == "spawn"]
    assert not back.is_error and "line 4" in back.content[0].text  # type: ignore[union-attr]
    assert of_type(events, SubagentCompleted)[0].child_run_id == spawned.child_run_id
    assert of_type(events, RunCompleted)[0].reply == "The subagent says: greet.py line 4"


OVERFLOW = """
scripts:
  - name: main
    turns:
      - tool_calls: [{name: ls, input: {path: "."}}]
      - tool_calls: [{name: read, input: {path: greet.py}}]
      - tool_calls: [{name: read, input: {path: README.md}}]
      - error: {kind: overflow, message: "prompt is too long: 210000 tokens > 200000 maximum", times: 1}
        text: "done after compaction"
"""


async def test_overflow_compacts_and_retries_once(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    async with running_host(
        log, engine, agent_reactors(log, engine, scripted(OVERFLOW), workspace)
    ):
        task = submit("read everything", workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
    (compacted,) = of_type(events, ContextCompacted)
    assert compacted.turns_summarised == 1 and "ls" in compacted.summary
    assert of_type(events, RunCompleted)[0].reply == "done after compaction"
    assert not of_type(events, LlmFailed)


RETRY = """
scripts:
  - name: main
    turns:
      - error: {kind: retryable, message: "overloaded_error (529)", times: 2}
        text: "made it"
"""


async def test_retryable_errors_retry_then_succeed(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    async with running_host(log, engine, agent_reactors(log, engine, scripted(RETRY), workspace)):
        task = submit("hello", workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
    failures = of_type(events, LlmFailed)
    assert [(f.kind, f.will_retry, f.attempts) for f in failures] == [
        ("retryable", True, 1), ("retryable", True, 2),
    ]  # fmt: skip
    assert of_type(events, RunCompleted)[0].reply == "made it"


FORGED = """
scripts:
  - name: main
    turns:
      - tool_calls: [{name: write, input: {path: pwned.txt, content: "x"}}]
      - text: "tried"
"""


async def test_a_tool_call_without_a_grant_is_never_executed(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    reactors = agent_reactors(log, engine, scripted(FORGED), workspace, policy=False)
    async with running_host(log, engine, reactors):
        task = submit("write a file", workspace)
        await log.append(task)

        async def requested() -> list[ToolRequested]:
            return of_type([s.event for s in await read_run(log, task.run_id or "")], ToolRequested)

        (req,) = await eventually(requested)
        await asyncio.sleep(1.0)  # no policy runs: nothing may happen
        assert not (workspace / "pwned.txt").exists()
        forged = GrantIssued(
            grant_id="forged", call_id=req.call_id, tool="write", capabilities=[], scope="step",
            tier="safe", expires_at=utcnow(), run_id=task.run_id, source="mallory",
        )  # fmt: skip
        await log.append(forged)

        async def rejected() -> list[SecurityRejected]:
            return of_type(
                [s.event for s in await read_run(log, task.run_id or "")], SecurityRejected
            )

        (refusal,) = await eventually(rejected)
        events = [s.event for s in await read_run(log, task.run_id or "")]
    assert not (workspace / "pwned.txt").exists()
    assert "not signed" in refusal.reason and refusal.call_id == req.call_id
    assert not of_type(events, ToolStarted) and not of_type(events, ToolCompleted)


ESCAPES = """
scripts:
  - name: main
    turns:
      - tool_calls:
          - {name: read, input: {path: "../secret.txt"}}
          - {name: read, input: {path: "/etc/passwd"}}
          - {name: read, input: {path: "link/secret.txt"}}
          - {name: write, input: {path: "link/new.txt", content: "x"}}
          - {name: read, input: {path: "greet.py"}}
      - text: "done"
"""


async def test_path_escapes_are_denied(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret.txt").write_text("top secret")
    os.symlink(tmp_path, workspace / "link")
    async with running_host(log, engine, agent_reactors(log, engine, scripted(ESCAPES), workspace)):
        task = submit("escape", workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
    denied = of_type(events, GrantDenied)
    assert len(denied) == 4 and all("no rule allows" in d.reason for d in denied)
    assert [c.tool for c in of_type(events, ToolCompleted)] == ["read"], "only greet.py was read"
    assert not (tmp_path / "new.txt").exists()
    assert "top secret" not in str([e for e in events])


SLEEP = f"60.{os.getpid()}{secrets.randbelow(10**6)}"  # unique to this test process
CANCEL = f"""
scripts:
  - name: main
    turns:
      - tool_calls: [{{name: exec, input: {{command: "sleep {SLEEP} & sleep {SLEEP}; echo never"}}}}]
      - text: "never"
"""


async def test_cancel_aborts_the_running_tool_and_kills_its_process_tree(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    async with running_host(log, engine, agent_reactors(log, engine, scripted(CANCEL), workspace)):
        task = submit("long job", workspace)
        await log.append(task)

        def sleepers() -> list[psutil.Process]:
            return [
                p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", SLEEP]
            ]

        await eventually(lambda: len(sleepers()) == 2)
        await log.append(RunCancelled(run_id=task.run_id, reason="changed my mind", by="test"))
        events = await finished(log, task.run_id or "")
        await eventually(lambda: not sleepers(), timeout=10)
        (aborted,) = await eventually(lambda: _completed(log, task.run_id or ""))
    assert aborted.is_error and aborted.error_kind == "aborted"
    assert of_type(events, RunCancelled) and not of_type(events, RunCompleted)


async def _completed(log: EventLog, run_id: str) -> list[ToolCompleted]:
    return of_type([s.event for s in await read_run(log, run_id)], ToolCompleted)


async def test_the_replay_provider_reproduces_a_past_run(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    provider = ScriptedProvider.from_yaml(demo.SCRIPT)
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        original = submit(demo.TASK, workspace)
        await log.append(original)
        recorded = await finished(log, original.run_id or "")
    again = demo.make_workspace(tmp_path / "again")
    replay = ReplayProvider.from_events(recorded)
    async with running_host(log, engine, agent_reactors(log, engine, replay, again)):
        rerun = submit(demo.TASK, again)
        await log.append(rerun)
        replayed = await finished(log, rerun.run_id or "")

    def shape(events: list[Event]) -> list[tuple[str, str]]:
        # grant.revoked follows run.completed asynchronously (the policy reacts to the end):
        # whether a read sees them depends on timing, not on the replay
        return [(e.type, getattr(e, "tool", "")) for e in events
                if e.type not in ("llm.delta", "tool.output", "grant.revoked")]  # fmt: skip

    assert shape(replayed) == shape(recorded)
    assert [_without_ids(r.content) for r in of_type(replayed, LlmResponded)] == [
        _without_ids(r.content) for r in of_type(recorded, LlmResponded)
    ]
    # a re-run is a new run: its calls never reuse the recorded call ids (approvals, grants
    # and audit rows of the two runs stay apart)
    old_ids = {c.call_id for c in of_type(recorded, ToolRequested)}
    new_ids = {c.call_id for c in of_type(replayed, ToolRequested)}
    assert new_ids and old_ids and not (old_ids & new_ids)
    assert (again / "greet.py").read_text() == (workspace / "greet.py").read_text()
    shutil.rmtree(again)


def _without_ids(content: list[object]) -> list[object]:
    return [
        msgspec.structs.replace(b, id="") if isinstance(b, ToolUseBlock) else b for b in content
    ]


async def test_a_rerun_of_a_run_with_a_subagent_replays_the_child_too(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    async with running_host(log, engine, agent_reactors(log, engine, scripted(SPAWN), workspace)):
        original = submit("delegate the search", workspace)
        await log.append(original)
        parent = await finished(log, original.run_id or "")
        (spawned,) = of_type(parent, SubagentSpawned)
        child = [s.event for s in await read_run(log, spawned.child_run_id)]
    replay = ReplayProvider.from_events([*parent, *child], root=original.run_id)
    async with running_host(log, engine, agent_reactors(log, engine, replay, workspace)):
        rerun = submit("delegate the search", workspace)
        await log.append(rerun)
        replayed = await finished(log, rerun.run_id or "")
        (again,) = of_type(replayed, SubagentSpawned)
        child_again = await finished(log, again.child_run_id)
    assert of_type(replayed, RunCompleted) and of_type(child_again, RunCompleted)
    assert again.child_run_id != spawned.child_run_id
    assert [r.text for r in of_type(replayed, ReplySent)] == [
        r.text for r in of_type(parent, ReplySent)
    ]
    assert [c.tool for c in of_type(child_again, ToolCompleted)] == ["grep"]


HISTORY = """
scripts:
  - name: main
    turns:
      - text: "noted: {task}"
"""


async def test_a_new_task_sees_its_session_history(
    log: EventLog, engine: AsyncEngine, workspace: Path
) -> None:
    seen: list = []
    provider = scripted(HISTORY)
    original = provider.complete

    async def spy(request, **kw):  # type: ignore[no-untyped-def]
        seen.append(request)
        return await original(request, **kw)

    provider.complete = spy  # type: ignore[method-assign]
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        first = submit("my name is Ada", workspace, session_id="s-42")
        await log.append(first)
        await finished(log, first.run_id or "")
        # no pause: the LLM handler's session index folds the log up to the new task first
        second = submit("what is my name?", workspace, session_id="s-42")
        await log.append(second)
        await finished(log, second.run_id or "")
    texts = [[b.text for b in m.content] for m in seen[1].messages]
    assert texts == [["my name is Ada"], ["noted: my name is Ada"], ["what is my name?"]]


async def test_a_result_too_large_for_an_event_keeps_a_preview_and_goes_to_the_object_store(
    log: EventLog, workspace: Path
) -> None:
    from nanocrab.bus.artifacts import JetStreamArtifacts
    from nanocrab.events import Codec, TextBlock
    from nanocrab.handlers.executor import Executor
    from nanocrab.tools import LocalOperations

    from .agent_fixtures import registry

    artifacts = JetStreamArtifacts(log)
    executor = Executor(log, registry=registry(), ops=LocalOperations(), artifacts=artifacts,
                        default_workspace=workspace, trusted_policy=frozenset(),
                        trusted_approvers=frozenset())  # fmt: skip
    huge = "x" * (log.codec.max_bytes + 10)
    fitted = await executor._fit(
        ToolCompleted(call_id="c", tool="web_fetch", content=[TextBlock(huge)])
    )
    assert len(Codec(max_bytes=log.codec.max_bytes).encode(fitted)) <= log.codec.max_bytes
    (ref,) = fitted.artifacts
    assert await artifacts.get(ref) == huge.encode()
    assert "truncated" in fitted.content[0].text and ref.key in fitted.content[0].text  # type: ignore[union-attr]
