"""Model failover through the bus with the real Anthropic SDK; only the HTTP API is faked (respx).

The agent's models (agents.yaml ``models``) are tried in order: an overload moves on at once, a
rate limit after the retries, a connection failure after the retries; an invalid request fails
the run on the first model. Every move is an ``llm.failed`` naming the model and the target."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import respx
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.agents import DEFAULT, PROFILES, ModelChoice
from nanocrab.bus import EventLog
from nanocrab.events import Event, LlmFailed, LlmResponded, RunCompleted, RunFailed
from nanocrab.llm import AnthropicProvider
from nanocrab.llm.failover import FailoverPolicy
from nanocrab.projections.timeline import summarize
from nanocrab.routing import install_profiles, parse_agents

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
)

pytestmark = pytest.mark.timeout(60)

SECOND = "claude-haiku-4-5"
THIRD = "claude-opus-4-1"


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(using=HTTPCore2Mocker.name, base_url=BASE_URL) as router:
        yield router


@pytest.fixture
def failover_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default agent fails over to two more models, as an agents.yaml would declare."""
    monkeypatch.setitem(PROFILES, "default", PROFILES.get("default", DEFAULT))
    config = parse_agents(
        f"""
version: 1
agents:
  - name: default
    description: the default agent
    model: {MODEL}
    models: [{SECOND}, {{model: {THIRD}}}]
"""
    )
    install_profiles(config)
    assert PROFILES["default"].models == (ModelChoice(model=SECOND), ModelChoice(model=THIRD))


def answer(text: str, model: str) -> httpx.Response:
    """A streamed answer from ``model`` (the API names the model that answered)."""
    start = message_start(input_tokens=100)
    start["message"]["model"] = model
    return stream_response(start, *text_block(0, text), *message_end("end_turn", 5))


def by_model(
    responses: dict[str, Callable[[], httpx.Response]], calls: list[str]
) -> Callable[[httpx.Request], httpx.Response]:
    """Answer each request by the model it names, recording the order of the models asked."""

    def respond(request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        calls.append(model)
        return responses[model]()

    return respond


async def run_task(log: EventLog, engine: AsyncEngine, workspace: Path) -> list[Event]:
    provider = AnthropicProvider(api_key="sk-test", base_url=BASE_URL, model=MODEL)
    async with running_host(log, engine, agent_reactors(log, engine, provider, workspace)):
        task = submit("hello", workspace)
        await log.append(task)
        return await finished(log, task.run_id or "")


async def test_an_overloaded_model_moves_to_the_next_at_once(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, api: respx.Router, failover_models: None
) -> None:
    calls: list[str] = []
    api.post("/v1/messages").mock(side_effect=by_model({
        MODEL: lambda: error_response(529, "overloaded_error", "Overloaded"),
        SECOND: lambda: answer("hello from the second model", SECOND),
    }, calls))  # fmt: skip
    events = await run_task(log, engine, demo.make_workspace(tmp_path / "ws"))
    assert calls == [MODEL, SECOND], "no retry on an overloaded model when another is left"
    (moved,) = of_type(events, LlmFailed)
    assert (moved.status_code, moved.will_retry, moved.model, moved.failover_to) == (
        529, True, MODEL, SECOND,
    )  # fmt: skip
    assert "overloaded" in moved.message
    assert summarize(moved).endswith(f"failover from {MODEL} to {SECOND}"), "timelines show it"
    (responded,) = of_type(events, LlmResponded)
    assert responded.model == SECOND and responded.provider == "anthropic"
    assert of_type(events, RunCompleted)[0].reply == "hello from the second model"


async def test_a_rate_limit_past_the_retries_then_an_outage_move_down_the_list(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, api: respx.Router, failover_models: None
) -> None:
    calls: list[str] = []

    def refused() -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    api.post("/v1/messages").mock(side_effect=by_model({
        MODEL: lambda: error_response(429, "rate_limit_error", "Too many requests"),
        SECOND: refused,
        THIRD: lambda: answer("third time lucky", THIRD),
    }, calls))  # fmt: skip
    events = await run_task(log, engine, demo.make_workspace(tmp_path / "ws"))
    assert calls == [MODEL] * 4 + [SECOND] * 4 + [THIRD], "each model retried, then the next"
    failures = of_type(events, LlmFailed)
    assert [(f.model, f.attempts, f.failover_to) for f in failures] == [
        (MODEL, 1, ""), (MODEL, 2, ""), (MODEL, 3, ""), (MODEL, 4, SECOND),
        (SECOND, 1, ""), (SECOND, 2, ""), (SECOND, 3, ""), (SECOND, 4, THIRD),
    ]  # fmt: skip
    assert all(f.will_retry and f.kind == "retryable" for f in failures)
    assert failures[3].status_code == 429 and "cannot reach" in failures[7].message
    assert of_type(events, LlmResponded)[0].model == THIRD
    assert of_type(events, RunCompleted)[0].reply == "third time lucky"


async def test_an_invalid_request_fails_the_run_without_moving(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, api: respx.Router, failover_models: None
) -> None:
    calls: list[str] = []
    api.post("/v1/messages").mock(side_effect=by_model({
        MODEL: lambda: error_response(400, "invalid_request_error", "messages: field required"),
        SECOND: lambda: answer("never asked", SECOND),
    }, calls))  # fmt: skip
    events = await run_task(log, engine, demo.make_workspace(tmp_path / "ws"))
    assert calls == [MODEL], "a request the API rejects would be rejected by any model"
    (failed,) = of_type(events, LlmFailed)
    assert failed.kind == "fatal" and not failed.will_retry and failed.failover_to == ""
    (run_failed,) = of_type(events, RunFailed)
    assert run_failed.kind == "llm" and "invalid request (400)" in run_failed.reason


async def test_when_the_last_model_fails_too_the_run_fails_with_its_error(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, api: respx.Router, failover_models: None
) -> None:
    calls: list[str] = []
    overloaded = lambda: error_response(529, "overloaded_error", "Overloaded")  # noqa: E731
    api.post("/v1/messages").mock(
        side_effect=by_model({MODEL: overloaded, SECOND: overloaded, THIRD: overloaded}, calls)
    )
    events = await run_task(log, engine, demo.make_workspace(tmp_path / "ws"))
    assert calls == [MODEL, SECOND] + [THIRD] * 4, "the last model is retried as before"
    failures = of_type(events, LlmFailed)
    assert [f.failover_to for f in failures if f.failover_to] == [SECOND, THIRD]
    assert not failures[-1].will_retry and failures[-1].status_code == 529
    assert of_type(events, RunFailed)[0].kind == "llm"


def test_the_policy_moves_retryable_errors_only() -> None:
    from nanocrab.llm import LlmError

    policy = FailoverPolicy()
    assert policy.at_once(LlmError("retryable", "overloaded", status_code=529))
    assert not policy.at_once(LlmError("retryable", "rate limited", status_code=429))
    assert policy.moves(LlmError("retryable", "rate limited", status_code=429))
    assert policy.moves(LlmError("retryable", "cannot reach the API"))
    assert not policy.moves(LlmError("fatal", "invalid request", status_code=400))
    assert not policy.moves(LlmError("overflow", "context overflow", status_code=400))
