"""ScriptedProvider: the deterministic offline model the demo and the handler tests run on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nanocrab.events import TextBlock, ToolUseBlock
from nanocrab.llm import (
    LlmConfigError,
    LlmError,
    Message,
    ModelRequest,
    ScriptedProvider,
    make_provider,
)

SCRIPT = """
scripts:
  - name: fix-greeting
    match: "greet(ing)?"
    turns:
      - text: "Let me look around."
        tool_calls:
          - {name: ls, input: {path: "."}}
          - {name: read, input: {path: "greet.py", limit: 20}}
      - tool_calls: [{name: read, input: {path: "greet.py"}}]
      - text: "Done with: {task}"
  - name: flaky
    match: "flaky"
    turns:
      - error: {kind: retryable, message: "overloaded", times: 2}
        text: "finally"
      - error: {kind: overflow, message: "prompt is too long"}
        text: "after compaction"
      - error: {kind: fatal, message: "bad key"}
  - name: greet-shadowed
    match: "greeting"
    turns:
      - text: "never chosen: an earlier script matches first"
  - name: fallback
    turns:
      - text: "I can only echo: {task}"
"""


@pytest.fixture
def model() -> ScriptedProvider:
    return ScriptedProvider.from_text(SCRIPT)


def ask(task: str, turn: int = 0, run_id: str = "run-1") -> ModelRequest:
    return ModelRequest(
        system="You are nanocrab.",
        messages=[Message(role="user", content=[TextBlock(task)])],
        run_id=run_id,
        turn=turn,
        task=task,
    )


async def test_turns_are_served_in_order(model: ScriptedProvider) -> None:
    first = await model.complete(ask("Fix the GREETING in greet.py", turn=0))
    assert first.stop_reason == "tool_use"
    assert first.content[0] == TextBlock("Let me look around.")
    assert [(b.name, b.input) for b in first.content[1:] if isinstance(b, ToolUseBlock)] == [
        ("ls", {"path": "."}),
        ("read", {"path": "greet.py", "limit": 20}),
    ]
    assert first.model == "scripted:fix-greeting"
    assert first.cost_usd == 0.0

    second = await model.complete(ask("Fix the GREETING in greet.py", turn=1))
    assert second.stop_reason == "tool_use"
    assert len(second.content) == 1 and isinstance(second.content[0], ToolUseBlock)

    third = await model.complete(ask("Fix the GREETING in greet.py", turn=2))
    assert third.content == [TextBlock("Done with: Fix the GREETING in greet.py")]
    assert third.stop_reason == "end_turn"


async def test_past_the_last_turn_the_script_is_finished(model: ScriptedProvider) -> None:
    response = await model.complete(ask("greet me", turn=3))
    assert response.content == [TextBlock("(script finished)")]
    assert response.stop_reason == "end_turn"


async def test_first_matching_script_wins_else_the_fallback(model: ScriptedProvider) -> None:
    assert model.script_for("update the greeting").name == "fix-greeting"
    assert model.script_for("a FLAKY test").name == "flaky"
    response = await model.complete(ask("what time is it?"))
    assert response.model == "scripted:fallback"
    assert response.content == [TextBlock("I can only echo: what time is it?")]


async def test_without_a_fallback_an_unmatched_task_is_fatal() -> None:
    model = ScriptedProvider.from_text(
        "scripts: [{name: only, match: '^deploy', turns: [{text: ok}]}]"
    )
    with pytest.raises(LlmError) as caught:
        await model.complete(ask("say hi"))
    assert caught.value.kind == "fatal"
    assert "no fallback script" in caught.value.message


async def test_tool_use_ids_are_deterministic_and_distinct(model: ScriptedProvider) -> None:
    def ids(response) -> list[str]:
        return [b.id for b in response.content if isinstance(b, ToolUseBlock)]

    first = ids(await model.complete(ask("greet", turn=0, run_id="run-1")))
    again = ids(
        await ScriptedProvider.from_text(SCRIPT).complete(ask("greet", turn=0, run_id="run-1"))
    )
    other_run = ids(await model.complete(ask("greet", turn=0, run_id="run-2")))
    next_turn = ids(await model.complete(ask("greet", turn=1, run_id="run-1")))

    assert first == again
    assert all(re.fullmatch(r"toolu_[0-9a-f]{24}", i) for i in first)
    assert len(first) == len(other_run) == 2 and len(next_turn) == 1
    assert len({*first, *other_run, *next_turn}) == 5


async def test_text_is_streamed_in_a_few_chunks(model: ScriptedProvider) -> None:
    chunks: list[str] = []

    async def on_delta(text: str) -> None:
        chunks.append(text)

    task = "please greet everyone in the room politely"
    response = await model.complete(ask(task, turn=2), on_delta=on_delta)
    assert 1 < len(chunks) <= 3
    assert "".join(chunks) == f"Done with: {task}" == response.content[0].text


async def test_tool_only_turn_streams_nothing(model: ScriptedProvider) -> None:
    chunks: list[str] = []

    async def on_delta(text: str) -> None:
        chunks.append(text)

    await model.complete(ask("greet", turn=1), on_delta=on_delta)
    assert chunks == []


async def test_usage_is_synthetic_and_deterministic(model: ScriptedProvider) -> None:
    short = await model.complete(ask("greet", turn=2))
    again = await model.complete(ask("greet", turn=2))
    longer = await model.complete(ask("greet " + "x" * 400, turn=2))
    assert short.usage == again.usage
    assert short.usage.input_tokens > 0 and short.usage.output_tokens > 0
    assert longer.usage.input_tokens - short.usage.input_tokens in (100, 101)
    assert longer.usage.output_tokens - short.usage.output_tokens in (100, 101)


async def test_injected_errors_fail_the_first_attempts_of_a_turn(model: ScriptedProvider) -> None:
    for _ in range(2):
        with pytest.raises(LlmError) as caught:
            await model.complete(ask("flaky", turn=0))
        assert (caught.value.kind, caught.value.message) == ("retryable", "overloaded")
    response = await model.complete(ask("flaky", turn=0))
    assert response.content == [TextBlock("finally")]
    assert (await model.complete(ask("flaky", turn=0))).content == [TextBlock("finally")]

    with pytest.raises(LlmError, match="overflow: prompt is too long"):
        await model.complete(ask("flaky", turn=1))
    assert (await model.complete(ask("flaky", turn=1))).content == [TextBlock("after compaction")]


async def test_injected_error_counts_are_per_run(model: ScriptedProvider) -> None:
    with pytest.raises(LlmError):
        await model.complete(ask("flaky", turn=1, run_id="run-a"))
    assert (await model.complete(ask("flaky", turn=1, run_id="run-a"))).content
    with pytest.raises(LlmError):
        await model.complete(ask("flaky", turn=1, run_id="run-b"))


async def test_error_only_turn_answers_with_nothing_once_spent(model: ScriptedProvider) -> None:
    with pytest.raises(LlmError) as caught:
        await model.complete(ask("flaky", turn=2))
    assert caught.value.kind == "fatal"
    response = await model.complete(ask("flaky", turn=2))
    assert (response.content, response.stop_reason) == ([], "end_turn")


async def test_responses_do_not_share_the_scripts_inputs(model: ScriptedProvider) -> None:
    first = await model.complete(ask("greet"))
    call = first.content[1]
    assert isinstance(call, ToolUseBlock)
    call.input["path"] = "/etc/passwd"
    second = await model.complete(ask("greet"))
    assert second.content[1] == ToolUseBlock(id=call.id, name="ls", input={"path": "."})


# --- loading and validation ---


def test_from_yaml_and_make_provider(tmp_path: Path) -> None:
    path = tmp_path / "demo.yaml"
    path.write_text(SCRIPT, encoding="utf-8")
    assert [s.name for s in ScriptedProvider.from_yaml(path).scripts] == [
        "fix-greeting",
        "flaky",
        "greet-shadowed",
        "fallback",
    ]
    for provider in (
        make_provider("scripted", script=path),
        make_provider("scripted", text=SCRIPT),
    ):
        assert isinstance(provider, ScriptedProvider)
        assert provider.name == "scripted"
        assert len(provider.scripts) == 4


def test_make_provider_needs_exactly_one_source() -> None:
    with pytest.raises(LlmConfigError, match="exactly one of script=PATH"):
        make_provider("scripted")
    with pytest.raises(LlmConfigError, match="got script, text"):
        make_provider("scripted", script="a.yaml", text=SCRIPT)


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(LlmConfigError, match=f"cannot read model script {re.escape(str(missing))}"):
        ScriptedProvider.from_yaml(missing)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("scripts:\n  - name: x\n    turns: [text: 'a'\n", encoding="utf-8")
    with pytest.raises(
        LlmConfigError, match=f"model script {re.escape(str(path))} is not valid YAML"
    ):
        ScriptedProvider.from_yaml(path)


@pytest.mark.parametrize(
    "yaml_text, where, why",
    [
        (
            "scripts: [{name: a, turns: [{text: hi, tool_call: []}]}]",
            "scripts.0.turns.0.tool_call",
            "Extra inputs",
        ),
        (
            "scripts: [{name: a, turns: [{text: hi}]}, {name: b, turns: []}]",
            "scripts.1.turns",
            "at least 1",
        ),
        (
            "scripts: [{name: a, match: '(unclosed', turns: [{text: hi}]}]",
            "scripts.0.match",
            "not a valid regular expression",
        ),
        (
            "scripts: [{name: a, turns: [{tool_calls: [{input: {}}]}]}]",
            "scripts.0.turns.0.tool_calls.0.name",
            "Field required",
        ),
        (
            "scripts: [{name: a, turns: [{error: {kind: flaky}}]}]",
            "scripts.0.turns.0.error.kind",
            "retryable",
        ),
        (
            "scripts: [{name: a, turns: [{error: {kind: fatal, times: 0}}]}]",
            "scripts.0.turns.0.error.times",
            "greater than or equal to 1",
        ),
        (
            "scripts: [{name: a, turns: [{}]}]",
            "scripts.0.turns.0",
            "needs text, tool_calls or error",
        ),
        ("scripts: []", "scripts", "at least 1"),
        ("- just a list", "(top level)", "valid dictionary"),
    ],
)
def test_invalid_scripts_name_the_field(yaml_text: str, where: str, why: str) -> None:
    with pytest.raises(LlmConfigError) as caught:
        ScriptedProvider.from_text(yaml_text, source="demo.yaml")
    message = caught.value.message
    assert message.startswith("model script demo.yaml is invalid: ")
    assert f"{where}: " in message
    assert why in message
