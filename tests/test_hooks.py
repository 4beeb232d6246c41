"""Extension hooks: hooks.yaml, the three points, and a run through the bus whose log shows
what each hook did (``hook.applied``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog, read_run
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.events import (
    HookApplied,
    LlmResponded,
    RunCompleted,
    TextBlock,
    ToolCompleted,
    ToolResultBlock,
)
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.hooks import HooksHandler
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.hooks import HookConfigError, Hooks, ModelContext, RunEnd, parse_hooks, read_hooks
from nanocrab.llm import ScriptedProvider
from nanocrab.llm.base import Message, ModelRequest
from nanocrab.security import KeyRing, signed_by
from nanocrab.tools import LocalOperations

from .agent_fixtures import (
    OPEN_POLICY,
    Recording,
    finished,
    of_type,
    registry,
    running_host,
    submit,
)
from .conftest import eventually

SAMPLE = "tests.hooks_sample"


def hooks(*specs: dict[str, Any]) -> Hooks:
    return Hooks.load(parse_hooks({"hooks": list(specs)}, "test"))


def request(system: str = "You are careful.") -> ModelRequest:
    return ModelRequest(
        system=system, messages=[Message(role="user", content=[TextBlock("hi")])], run_id="r",
        turn=2,
    )  # fmt: skip


# --- configuration -------------------------------------------------------------------------------


def test_hooks_yaml_is_read_and_imported(tmp_path: Path) -> None:
    path = tmp_path / "hooks.yaml"
    path.write_text(
        "hooks:\n"
        f"  - {{name: rules, point: before_model, function: '{SAMPLE}:house_rules'}}\n"
        f"  - {{name: redact, point: after_tool, function: '{SAMPLE}:redact', tools: [read]}}\n"
    )
    loaded = Hooks.load(read_hooks(path))
    assert [h.spec.name for h in loaded.at("before_model")] == ["rules"]
    assert [h.spec.tools for h in loaded.at("after_tool")] == [("read",)]
    assert loaded.at("run_end") == []


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"name": "x", "point": "after_model", "function": f"{SAMPLE}:tag"}, "point"),
        ({"name": "x", "point": "run_end", "function": f"{SAMPLE}:summary", "tools": ["read"]},
         "after_tool hooks only"),
        ({"name": "x", "point": "run_end", "function": "no_such_module_q:f"}, "cannot import"),
        ({"name": "x", "point": "run_end", "function": f"{SAMPLE}:missing"}, "not a function"),
        ({"name": "x", "point": "run_end", "function": f"{SAMPLE}:two_args"}, "one argument"),
        ({"name": "x", "point": "run_end", "function": "not a path"}, "function"),
        ({"name": "x", "point": "run_end", "function": f"{SAMPLE}:summary", "when": 1}, "when"),
    ],
)  # fmt: skip
def test_a_bad_hook_is_refused_at_load_saying_what_to_fix(
    spec: dict[str, Any], problem: str
) -> None:
    with pytest.raises(HookConfigError, match=problem):
        hooks(spec)


def test_hook_names_are_unique() -> None:
    spec = {"name": "x", "point": "run_end", "function": f"{SAMPLE}:summary"}
    with pytest.raises(HookConfigError, match="unique: x"):
        hooks(spec, spec)


# --- the points ----------------------------------------------------------------------------------


async def test_before_model_changes_the_context_and_says_how() -> None:
    h = hooks(
        {"name": "same", "point": "before_model", "function": f"{SAMPLE}:unchanged"},
        {"name": "rules", "point": "before_model", "function": f"{SAMPLE}:house_rules"},
    )
    changed, events = await h.before_model(request(), agent="default")
    assert changed.system == "You are careful.\nHouse rule: answer in haiku."
    assert changed.messages == request().messages
    (event,) = events  # the hook that changed nothing left no event
    assert (event.hook, event.point, event.turn) == ("rules", "before_model", 2)
    assert event.before != event.after and len(event.before) == 16
    assert event.summary == "system 16→45 chars"
    assert "+House rule: answer in haiku." in event.diff and event.error is None


async def test_a_failing_hook_is_recorded_and_its_input_kept() -> None:
    h = hooks({"name": "broken", "point": "before_model", "function": f"{SAMPLE}:broken"})
    changed, (event,) = await h.before_model(request(), agent="default")
    assert changed == request()
    assert event.error == "RuntimeError: the hook fell over"
    assert event.before == event.after


async def test_hooks_limited_to_agents_skip_other_runs() -> None:
    spec = {"name": "rules", "point": "before_model", "function": f"{SAMPLE}:house_rules",
            "agents": ["reviewer"]}  # fmt: skip
    assert (await hooks(spec).before_model(request(), agent="default"))[1] == []
    assert len((await hooks(spec).before_model(request(), agent="reviewer"))[1]) == 1


async def test_run_end_hooks_record_their_note() -> None:
    h = hooks({"name": "sum", "point": "run_end", "function": f"{SAMPLE}:summary"})
    (event,) = await h.run_end(RunEnd(run_id="r", status="completed", reply="done"))
    assert (event.hook, event.point, event.note, event.summary) == (
        "sum", "run_end", "completed: done", "run completed",
    )  # fmt: skip


def test_hook_values_are_frozen() -> None:
    ctx = ModelContext(run_id="r", agent="a", turn=0, system="s", messages=[])
    with pytest.raises(AttributeError):
        ctx.system = "t"  # type: ignore[misc]


# --- end to end through the bus ------------------------------------------------------------------

READ_SECRET = """
scripts:
  - name: read
    turns:
      - tool_calls: [{name: read, input: {path: notes.txt}}]
      - text: "The notes are read."
"""



async def test_a_run_through_the_bus_records_every_hook(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("the code is SECRET and SECRET\n")
    h = hooks(
        {"name": "rules", "point": "before_model", "function": f"{SAMPLE}:house_rules"},
        {"name": "redact", "point": "after_tool", "function": f"{SAMPLE}:redact",
         "tools": ["read", "grep"]},
        {"name": "tag", "point": "after_tool", "function": f"{SAMPLE}:tag", "tools": ["exec"]},
        {"name": "sum", "point": "run_end", "function": f"{SAMPLE}:summary"},
    )  # fmt: skip
    keys = KeyRing(tmp_path / "keys")
    policy_keys = frozenset({keys.public_key("policy")})
    reg = registry()
    model = Recording(ScriptedProvider.from_text(READ_SECRET))
    reactors = [
        Orchestrator(log, trust=signed_by(policy_keys)),
        PolicyHandler(log, policy=OPEN_POLICY, keys=keys, known_tools=frozenset(reg.names()),
                      default_workspace=workspace),
        Executor(log, registry=reg, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
                 default_workspace=workspace, trusted_policy=policy_keys,
                 trusted_approvers=trusted_approvers(OPEN_POLICY, keys), hooks=h),
        LlmHandler(log, provider=model, registry=reg, default_workspace=workspace, hooks=h),
        HooksHandler(log, hooks=h),
    ]  # fmt: skip
    task = submit("read the notes", workspace)
    async with running_host(log, sqlite_engine, reactors):
        await log.append(task)
        events = await finished(log, task.run_id or "")

        async def all_hooks() -> list[HookApplied]:
            found = [s.event for s in await read_run(log, task.run_id or "")]
            return [e for e in found if isinstance(e, HookApplied)]

        applied = await eventually(lambda: _when(all_hooks, 4))
    assert of_type(events, RunCompleted)[0].reply == "The notes are read."
    assert [(e.hook, e.point) for e in applied] == [
        ("rules", "before_model"), ("redact", "after_tool"), ("rules", "before_model"),
        ("sum", "run_end"),
    ]  # fmt: skip
    # the model saw the changed context, and the redacted result
    assert all(r.system.endswith("House rule: answer in haiku.") for r in model.requests)
    (result,) = [b for b in model.requests[1].messages[-1].content
                 if isinstance(b, ToolResultBlock)]  # fmt: skip
    assert result.content == [TextBlock("the code is [redacted] and [redacted]")]
    (done,) = of_type(events, ToolCompleted)
    assert done.content == [TextBlock("the code is [redacted] and [redacted]")]
    redact = applied[1]
    assert redact.note == "2 redacted" and redact.call_id == done.call_id
    assert redact.tool == "read" and "-the code is SECRET" in redact.diff
    assert applied[0].turn == 0 and applied[2].turn == 1
    assert applied[3].note == "completed: The notes are read."
    assert len(of_type(events, LlmResponded)) == 2


async def _when(fetch: Any, count: int) -> list[HookApplied] | None:
    found: list[HookApplied] = await fetch()
    return found if len(found) >= count else None


def test_the_hooks_file_is_named_by_the_environment_or_found_at_home(tmp_path: Path) -> None:
    from nanocrab.hooks import hooks_file

    assert hooks_file(tmp_path, {}) is None
    (tmp_path / "hooks.yaml").write_text("hooks: []\n")
    assert hooks_file(tmp_path, {}) == tmp_path / "hooks.yaml"
    other = tmp_path / "other.yaml"
    with pytest.raises(HookConfigError, match="no such file"):
        hooks_file(tmp_path, {"NANOCRAB_HOOKS": str(other)})
    other.write_text("hooks: []\n")
    assert hooks_file(tmp_path, {"NANOCRAB_HOOKS": str(other)}) == other


def test_the_timeline_line_says_which_hook_did_what() -> None:
    from nanocrab.projections.timeline import summarize

    event = HookApplied(hook="redact", point="after_tool", summary="content 30→37 chars",
                        note="1 redacted")  # fmt: skip
    assert summarize(event) == "redact at after_tool: content 30→37 chars; 1 redacted"
    failed = HookApplied(hook="rules", point="before_model", error="RuntimeError: x")
    assert summarize(failed) == "rules at before_model: error: RuntimeError: x"
