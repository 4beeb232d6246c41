"""The agent loop with the real Anthropic SDK underneath; only the HTTP API is faked (respx)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import respx
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import EventLog
from nanocrab.events import LlmFailed, LlmResponded, RunCompleted, RunFailed, ToolCompleted
from nanocrab.llm import AnthropicProvider

from .agent_fixtures import agent_reactors, finished, of_type, running_host, submit
from .test_llm_anthropic import (
    BASE_URL,
    MODEL,
    HTTPCore2Mocker,
    error_response,
    message_end,
    message_start,
    stream_response,
    text_block,
    tool_block,
)


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(using=HTTPCore2Mocker.name, base_url=BASE_URL) as router:
        yield router


@pytest.fixture
def provider() -> AnthropicProvider:
    return AnthropicProvider(api_key="sk-test", base_url=BASE_URL, model=MODEL)


async def test_a_claude_run_with_a_tool_call_after_429_and_529(
    log: EventLog,
    engine: AsyncEngine,
    tmp_path: Path,
    api: respx.Router,
    provider: AnthropicProvider,
) -> None:
    workspace = demo.make_workspace(tmp_path / "ws")
    api.post("/v1/messages").mock(
        side_effect=[
            error_response(
                429,
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            ),
            error_response(529, "overloaded_error", "Overloaded"),
            stream_response(
                message_start(input_tokens=900, cache_read=400),
                *text_block(0, "Reading ", "the code."),
                *tool_block(1, "toolu_01", "read", '{"path": ', '"greet.py"}'),
                *message_end("tool_use", 30),
            ),
            stream_response(
                message_start(input_tokens=1000),
                *text_block(0, "greet() is missing the comma."),
                *message_end("end_turn", 12),
            ),
        ]
    )
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        task = submit(demo.TASK, workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
    failures = of_type(events, LlmFailed)
    assert [(f.status_code, f.will_retry) for f in failures] == [(429, True), (529, True)]
    (read,) = of_type(events, ToolCompleted)
    assert read.tool == "read" and not read.is_error and "Hello" in read.content[0].text  # type: ignore[union-attr]
    first, second = of_type(events, LlmResponded)
    assert first.usage.cache_read_tokens == 400 and first.cost_usd > 0
    assert second.usage.input_tokens == 1000 and second.stop_reason == "end_turn"
    assert of_type(events, RunCompleted)[0].reply == "greet() is missing the comma."
    body = api.calls.last.request.content.decode()
    assert '"tool_result"' in body and "toolu_01" in body, "the tool result went back to Claude"
    assert '"name":"read"' in body.replace(" ", ""), "the tools were offered"


async def test_a_401_fails_the_run_with_a_readable_reason(
    log: EventLog,
    engine: AsyncEngine,
    tmp_path: Path,
    api: respx.Router,
    provider: AnthropicProvider,
) -> None:
    workspace = demo.make_workspace(tmp_path / "ws")
    route = api.post("/v1/messages").mock(
        return_value=error_response(401, "authentication_error", "invalid x-api-key")
    )
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        task = submit("hello", workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
    assert route.call_count == 1, "a fatal error is not retried"
    (failed,) = of_type(events, LlmFailed)
    assert failed.kind == "fatal" and failed.status_code == 401 and not failed.will_retry
    (run_failed,) = of_type(events, RunFailed)
    assert run_failed.kind == "llm"
    assert (
        "authentication failed (401)" in run_failed.reason
        and "ANTHROPIC_API_KEY" in run_failed.reason
    )
