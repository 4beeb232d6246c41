"""ReplayProvider (a past run's answers, by turn), make_provider, and the price table."""

from __future__ import annotations

import pytest

from nanocrab.events import LlmRequested, LlmResponded, RunStarted, TextBlock, ToolUseBlock, Usage
from nanocrab.llm import (
    PROVIDERS,
    LlmConfigError,
    LlmError,
    ModelRequest,
    ReplayProvider,
    cost_usd,
    make_provider,
    price_for,
)

RECORDED = [
    LlmResponded(
        run_id="run-old",
        turn=0,
        provider="anthropic",
        model="claude-sonnet-4-6",
        content=[
            TextBlock("Reading the file first."),
            ToolUseBlock(id="toolu_01A", name="read", input={"path": "greet.py"}),
        ],
        stop_reason="tool_use",
        usage=Usage(input_tokens=1200, output_tokens=40, cache_read_tokens=900),
        cost_usd=0.0042,
    ),
    LlmResponded(
        run_id="run-old",
        turn=1,
        provider="anthropic",
        model="claude-sonnet-4-6",
        content=[TextBlock("Fixed the greeting.")],
        stop_reason="end_turn",
        usage=Usage(input_tokens=1300, output_tokens=12),
        cost_usd=0.0041,
    ),
]


def ask(turn: int) -> ModelRequest:
    return ModelRequest(system="", messages=[], run_id="run-new", turn=turn, task="fix greet.py")


async def test_serves_each_turn_as_recorded() -> None:
    model = ReplayProvider(RECORDED)
    chunks: list[str] = []

    async def on_delta(text: str) -> None:
        chunks.append(text)

    first = await model.complete(ask(0), on_delta=on_delta)
    text, call = first.content
    assert text == RECORDED[0].content[0]
    assert isinstance(call, ToolUseBlock) and (call.name, call.input) == (
        "read",
        {"path": "greet.py"},
    )
    assert call.id.startswith("toolu_") and call.id != "toolu_01A", (
        "a re-run's call ids are its own"
    )
    again = await ReplayProvider(RECORDED).complete(ask(0))
    assert again.content[1] == call, "derived from the new run and the recorded id: stable"
    assert first.stop_reason == "tool_use"
    assert first.usage == RECORDED[0].usage
    assert first.model == "claude-sonnet-4-6"
    assert first.cost_usd == 0.0, "a replay spends nothing"
    assert "".join(chunks) == "Reading the file first."

    second = await model.complete(ask(1))
    assert (second.content, second.stop_reason) == ([TextBlock("Fixed the greeting.")], "end_turn")


async def test_a_turn_without_a_recording_is_fatal() -> None:
    model = ReplayProvider(RECORDED)
    with pytest.raises(LlmError) as caught:
        await model.complete(ask(2))
    assert caught.value.kind == "fatal"
    assert caught.value.message.startswith(
        "no recorded response for turn 2 of run run-old; the new code asked for more turns "
        "than the recording has"
    )
    assert "recorded turns: 0-1" in caught.value.message


async def test_from_events_keeps_only_model_responses() -> None:
    history = [RunStarted(run_id="run-old"), LlmRequested(run_id="run-old", turn=0), *RECORDED]
    model = ReplayProvider.from_events(history)
    assert model.turns == [0, 1]
    assert (await model.complete(ask(1))).content == [TextBlock("Fixed the greeting.")]


async def test_an_empty_recording_answers_nothing() -> None:
    with pytest.raises(LlmError, match="recorded turns: none"):
        await ReplayProvider([]).complete(ask(0))


def test_make_provider_replay_and_unknown_names() -> None:
    provider = make_provider("replay", responses=RECORDED)
    assert isinstance(provider, ReplayProvider) and provider.name == "replay"
    assert sorted(PROVIDERS) == ["anthropic", "replay", "scripted"]
    with pytest.raises(
        LlmConfigError,
        match="unknown model provider 'openai'; choose one of anthropic, replay, scripted",
    ):
        make_provider("openai")
    with pytest.raises(
        LlmConfigError, match=r"bad options for the 'replay' provider.*it accepts: responses"
    ):
        make_provider("replay", recording=RECORDED)


@pytest.mark.parametrize(
    "model, usd_in, usd_out",
    [
        ("claude-opus-4-5-20251101", 5.0, 25.0),
        ("claude-opus-4-1-20250805", 15.0, 75.0),
        ("claude-sonnet-4-5", 3.0, 15.0),
        ("claude-3-7-sonnet-20250219", 3.0, 15.0),
        ("claude-haiku-4-5", 1.0, 5.0),
        ("claude-3-5-haiku-20241022", 0.80, 4.0),
    ],
)
def test_prices_per_million_tokens(model: str, usd_in: float, usd_out: float) -> None:
    price = price_for(model)
    assert price is not None
    assert (price.input, price.output) == (usd_in, usd_out)
    assert price.cache_read == pytest.approx(usd_in / 10)
    assert price.cache_write == pytest.approx(usd_in * 1.25)
    assert cost_usd(model, Usage(input_tokens=1_000_000, output_tokens=1_000_000)) == pytest.approx(
        usd_in + usd_out
    )


def test_unknown_models_cost_nothing() -> None:
    usage = Usage(input_tokens=10_000, output_tokens=10_000)
    assert price_for("scripted:fallback") is None
    assert cost_usd("scripted:fallback", usage) == 0.0
    assert cost_usd("gpt-4o", usage) == 0.0
