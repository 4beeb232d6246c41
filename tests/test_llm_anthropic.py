"""AnthropicProvider against a faked Messages API: the real SDK runs, only HTTP is faked.

The installed SDK sends through ``httpx2``/``httpcore2`` while respx patches ``httpx``/``httpcore``,
so :class:`HTTPCore2Mocker` points respx's own httpcore mocker at ``httpcore2``'s connection pools:
routes are ordinary respx routes, and everything above the socket is the SDK's code.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpcore2
import httpx
import httpx2
import pytest
import respx
from respx.mocks import HTTPCoreMocker

from nanocrab.events import ImageBlock, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from nanocrab.llm import (
    AnthropicProvider,
    LlmConfigError,
    LlmError,
    Message,
    ModelRequest,
    ToolSpec,
    make_provider,
)


class HTTPCore2Mocker(HTTPCoreMocker):
    name = "httpcore2"
    targets = [
        "httpcore2._sync.connection_pool.ConnectionPool",
        "httpcore2._async.connection_pool.AsyncConnectionPool",
    ]

    @classmethod
    def from_sync_httpx_response(cls, httpx_response: httpx.Response, target: Any, **kwargs: Any):
        return httpcore2.Response(
            status=httpx_response.status_code,
            headers=httpx_response.headers.raw,
            content=httpx_response.stream,
            extensions=httpx_response.extensions,
        )


BASE_URL = "https://api.anthropic.com"
MODEL = "claude-sonnet-4-6"


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(using=HTTPCore2Mocker.name, base_url=BASE_URL) as router:
        yield router


@pytest.fixture
def provider() -> AnthropicProvider:
    return AnthropicProvider(api_key="sk-test", base_url=BASE_URL, model=MODEL)


# --- the wire format, as Anthropic documents streaming (Messages API, "Streaming messages") ---


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def message_start(*, input_tokens: int = 25, cache_read: int = 0, cache_write: int = 0) -> dict:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": MODEL,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_creation_input_tokens": cache_write,
                "cache_read_input_tokens": cache_read,
                "output_tokens": 1,
            },
        },
    }


def text_block(index: int, *pieces: str) -> list[dict]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": p},
            }
            for p in pieces
        ),
        {"type": "content_block_stop", "index": index},
    ]


def tool_block(index: int, tool_id: str, name: str, *json_pieces: str) -> list[dict]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
            for p in json_pieces
        ),
        {"type": "content_block_stop", "index": index},
    ]


def message_end(stop_reason: str, output_tokens: int) -> list[dict]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def stream_response(*events: dict) -> httpx.Response:
    return httpx.Response(200, content=sse(*events), headers={"content-type": "text/event-stream"})


def error_response(status: int, error_type: str, message: str, **extra: Any) -> httpx.Response:
    error = {"type": error_type, "message": message, **extra}
    return httpx.Response(
        status,
        json={"type": "error", "error": error},
        headers={"request-id": "req_018EeWyXxfu5pfWkrYcMdjWG"},
    )


def request(**overrides: Any) -> ModelRequest:
    fields: dict[str, Any] = {
        "system": "You are a careful coding agent.",
        "messages": [Message(role="user", content=[TextBlock("Say hello.")])],
        "run_id": "run-1",
        "task": "Say hello.",
    }
    return ModelRequest(**(fields | overrides))


def sent_body(route: respx.Route) -> dict[str, Any]:
    return json.loads(route.calls.last.request.content)


async def failure(provider: AnthropicProvider, req: ModelRequest | None = None) -> LlmError:
    with pytest.raises(LlmError) as caught:
        await provider.complete(req or request())
    return caught.value


# --- successful responses ---


async def test_text_response_streams_deltas_and_maps_usage_and_cost(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    route = api.post("/v1/messages").mock(
        return_value=stream_response(
            message_start(input_tokens=25, cache_read=1000, cache_write=200),
            {"type": "ping"},
            *text_block(0, "Hello", ", wor", "ld!"),
            *message_end("end_turn", 15),
        )
    )
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    response = await provider.complete(request(), on_delta=on_delta)

    assert deltas == ["Hello", ", wor", "ld!"]
    assert response.content == [TextBlock("Hello, world!")]
    assert response.stop_reason == "end_turn"
    assert response.model == MODEL
    assert response.usage == Usage(
        input_tokens=25, output_tokens=15, cache_read_tokens=1000, cache_write_tokens=200
    )
    # Sonnet: $3 in, $15 out, $0.30 cache read, $3.75 cache write per million tokens.
    assert response.cost_usd == pytest.approx((25 * 3 + 15 * 15 + 1000 * 0.30 + 200 * 3.75) / 1e6)
    assert route.call_count == 1
    sent = route.calls.last.request
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent_body(route) == {
        "model": MODEL,
        "max_tokens": 4096,
        "stream": True,
        "system": [{"type": "text", "text": "You are a careful coding agent."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
    }


async def test_tool_use_response_parses_streamed_input(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    api.post("/v1/messages").mock(
        return_value=stream_response(
            message_start(),
            *text_block(0, "Let me read it."),
            *tool_block(
                1,
                "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "read",
                "",
                '{"path": "gre',
                'et.py", "limit": 20}',
            ),
            *message_end("tool_use", 40),
        )
    )
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    response = await provider.complete(request(), on_delta=on_delta)

    assert response.stop_reason == "tool_use"
    assert response.content == [
        TextBlock("Let me read it."),
        ToolUseBlock(
            id="toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            name="read",
            input={"path": "greet.py", "limit": 20},
        ),
    ]
    assert deltas == ["Let me read it."]


async def test_request_body_carries_tools_tool_results_and_image_placeholders(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    route = api.post("/v1/messages").mock(
        return_value=stream_response(
            message_start(), *text_block(0, "ok"), *message_end("end_turn", 2)
        )
    )
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    conversation = [
        Message(
            role="user",
            content=[TextBlock("Fix greet.py"), ImageBlock("image/png", "runs/r1/shot.png")],
        ),
        Message(
            role="assistant",
            content=[
                TextBlock(""),
                ToolUseBlock(id="toolu_a", name="read", input={"path": "greet.py"}),
                ToolUseBlock(id="toolu_b", name="read", input={"path": "missing.py"}),
            ],
        ),
        Message(
            role="user",
            content=[
                ToolResultBlock(
                    tool_use_id="toolu_a",
                    content=[TextBlock("print('hi')"), ImageBlock("image/png", "a/b.png")],
                ),
                ToolResultBlock(
                    tool_use_id="toolu_b", content=[TextBlock("no such file")], is_error=True
                ),
            ],
        ),
    ]
    req = request(
        messages=conversation,
        tools=[ToolSpec(name="read", description="Read a file.", input_schema=schema)],
        model="claude-opus-4-6",
        max_tokens=64_000,
    )

    await provider.complete(req)

    body = sent_body(route)
    assert body["model"] == "claude-opus-4-6"
    assert body["max_tokens"] == 4096, "the provider's max_tokens caps the request's"
    assert body["tools"] == [
        {"name": "read", "description": "Read a file.", "input_schema": schema}
    ]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Fix greet.py"},
                {
                    "type": "text",
                    "text": "[image image/png stored as artifact runs/r1/shot.png; not shown]",
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_a",
                    "name": "read",
                    "input": {"path": "greet.py"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_b",
                    "name": "read",
                    "input": {"path": "missing.py"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_a",
                    "is_error": False,
                    "content": [
                        {"type": "text", "text": "print('hi')"},
                        {
                            "type": "text",
                            "text": "[image image/png stored as artifact a/b.png; not shown]",
                        },
                    ],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_b",
                    "is_error": True,
                    "content": [{"type": "text", "text": "no such file"}],
                },
            ],
        },
    ]


async def test_without_system_or_tools_the_fields_are_omitted(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    route = api.post("/v1/messages").mock(
        return_value=stream_response(
            message_start(), *text_block(0, "ok"), *message_end("end_turn", 2)
        )
    )
    await provider.complete(request(system="", max_tokens=100))
    body = sent_body(route)
    assert "system" not in body and "tools" not in body
    assert body["max_tokens"] == 100


# --- HTTP errors ---


async def test_prompt_too_long_is_overflow(api: respx.Router, provider: AnthropicProvider) -> None:
    api.post("/v1/messages").mock(
        return_value=error_response(
            400, "invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"
        )
    )
    error = await failure(provider)
    assert error.kind == "overflow"
    assert error.status_code == 400
    assert "208310 tokens > 200000 maximum" in error.message


async def test_other_bad_request_is_fatal(api: respx.Router, provider: AnthropicProvider) -> None:
    api.post("/v1/messages").mock(
        return_value=error_response(400, "invalid_request_error", "messages: roles must alternate")
    )
    error = await failure(provider)
    assert error.kind == "fatal"
    assert error.message.startswith("invalid request (400): messages: roles must alternate")


async def test_rate_limit_is_retryable_with_the_servers_wait(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    response = error_response(
        429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"
    )
    response.headers["retry-after"] = "7"
    route = api.post("/v1/messages").mock(return_value=response)
    error = await failure(provider)
    assert (error.kind, error.status_code, error.retry_after) == ("retryable", 429, 7.0)
    assert error.message.startswith("rate limited (429):")
    assert route.call_count == 1, "the SDK must not retry on its own"


@pytest.mark.parametrize(
    "message, extra",
    [
        ("You have exceeded your monthly usage quota.", {}),
        ("Your credit balance is too low to access the Anthropic API.", {}),
        ("Spend limit reached.", {"details": {"error_code": "enforced_spend_limit_reached"}}),
    ],
)
async def test_rate_limit_for_exhausted_quota_is_fatal(
    api: respx.Router, provider: AnthropicProvider, message: str, extra: dict
) -> None:
    api.post("/v1/messages").mock(
        return_value=error_response(429, "rate_limit_error", message, **extra)
    )
    error = await failure(provider)
    assert error.kind == "fatal"
    assert error.message.startswith(f"quota exhausted (429): {message}")


async def test_overloaded_is_retryable_and_not_retried_by_the_sdk(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    route = api.post("/v1/messages").mock(
        return_value=error_response(529, "overloaded_error", "Overloaded")
    )
    error = await failure(provider)
    assert (error.kind, error.status_code) == ("retryable", 529)
    assert error.message == "the API is overloaded (529): Overloaded"
    assert route.call_count == 1


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_retryable(
    api: respx.Router, provider: AnthropicProvider, status: int
) -> None:
    api.post("/v1/messages").mock(
        return_value=error_response(status, "api_error", "Internal server error")
    )
    error = await failure(provider)
    assert (error.kind, error.status_code) == ("retryable", status)


async def test_server_error_without_json_body_is_still_readable(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    api.post("/v1/messages").mock(return_value=httpx.Response(502, text="<html>Bad Gateway</html>"))
    error = await failure(provider)
    assert error.kind == "retryable"
    assert error.message == "server error (502): <html>Bad Gateway</html>"


async def test_bad_api_key_is_fatal_with_a_readable_message(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    api.post("/v1/messages").mock(
        return_value=error_response(401, "authentication_error", "invalid x-api-key")
    )
    error = await failure(provider)
    assert error.kind == "fatal"
    assert error.status_code == 401
    assert (
        error.message == "authentication failed (401): invalid x-api-key — check ANTHROPIC_API_KEY"
    )


async def test_permission_denied_is_fatal(api: respx.Router, provider: AnthropicProvider) -> None:
    api.post("/v1/messages").mock(
        return_value=error_response(
            403,
            "permission_error",
            "Your API key does not have permission to use the specified resource.",
        )
    )
    error = await failure(provider)
    assert (error.kind, error.status_code) == ("fatal", 403)
    assert error.message.startswith(
        "permission denied (403): Your API key does not have permission"
    )


async def test_unknown_model_is_fatal_and_names_the_model(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    api.post("/v1/messages").mock(
        return_value=error_response(404, "not_found_error", "model: claude-nope")
    )
    error = await failure(provider, request(model="claude-nope"))
    assert error.kind == "fatal"
    assert "check the model name 'claude-nope'" in error.message


# --- failures inside the stream and on the connection ---


@pytest.mark.parametrize(
    "error_type, kind",
    [
        ("overloaded_error", "retryable"),
        ("api_error", "retryable"),
        ("rate_limit_error", "retryable"),
        ("invalid_request_error", "fatal"),
        ("some_future_error", "retryable"),
    ],
)
async def test_error_event_mid_stream_is_classified_by_its_type(
    api: respx.Router, provider: AnthropicProvider, error_type: str, kind: str
) -> None:
    api.post("/v1/messages").mock(
        return_value=stream_response(
            message_start(),
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hel"},
            },
            {"type": "error", "error": {"type": error_type, "message": "Overloaded"}},
        )
    )
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    with pytest.raises(LlmError) as caught:
        await provider.complete(request(), on_delta=on_delta)
    assert caught.value.kind == kind
    assert caught.value.status_code is None, "the HTTP status was 200"
    assert f"({error_type} event in the response stream): Overloaded" in caught.value.message
    assert deltas == ["Hel"]


async def test_connection_refused_is_retryable(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    api.post("/v1/messages").mock(side_effect=httpx.ConnectError("[Errno 111] Connection refused"))
    error = await failure(provider)
    assert error.kind == "retryable"
    assert error.status_code is None
    assert error.message.startswith(f"cannot reach the Anthropic API at {BASE_URL}")
    assert "Connection refused" in error.message


async def test_timeout_is_retryable(api: respx.Router, provider: AnthropicProvider) -> None:
    api.post("/v1/messages").mock(side_effect=httpx2.ConnectTimeout("timed out"))
    error = await failure(provider)
    assert error.kind == "retryable"
    assert "did not answer in time" in error.message


async def test_connection_dropped_mid_stream_is_retryable(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield sse(message_start(), *text_block(0, "Hel"))
        raise httpx2.RemoteProtocolError(
            "peer closed connection without sending complete message body"
        )

    api.post("/v1/messages").mock(
        side_effect=lambda req: httpx.Response(
            200, content=body(), headers={"content-type": "text/event-stream"}
        )
    )
    error = await failure(provider)
    assert error.kind == "retryable"
    assert error.message.startswith("the connection dropped mid-response: RemoteProtocolError")


async def test_stream_that_ends_early_is_retryable(
    api: respx.Router, provider: AnthropicProvider
) -> None:
    api.post("/v1/messages").mock(
        return_value=stream_response(message_start(), *text_block(0, "Hel"))
    )
    error = await failure(provider)
    assert error.kind == "retryable"
    assert "ended before the message was complete" in error.message


# --- configuration ---


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No key in the environment and an empty home, so the SDK finds no profile either."""
    for name in (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_PROFILE",
        "ANTHROPIC_CONFIG_DIR",
        "ANTHROPIC_IDENTITY_TOKEN",
        "ANTHROPIC_IDENTITY_TOKEN_FILE",
        "ANTHROPIC_FEDERATION_RULE_ID",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_missing_credentials_fail_at_construction(no_credentials: Path) -> None:
    with pytest.raises(LlmConfigError, match="set ANTHROPIC_API_KEY or pass api_key"):
        AnthropicProvider(base_url=BASE_URL)


def test_broken_credentials_profile_fails_at_construction(
    no_credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_PROFILE", "work")
    with pytest.raises(
        LlmConfigError, match="cannot load Anthropic credentials: Config file not found"
    ):
        AnthropicProvider(base_url=BASE_URL)


def test_key_from_the_environment_is_accepted(
    no_credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    assert AnthropicProvider(base_url=BASE_URL)._client.api_key == "sk-env"


def test_make_provider_builds_an_anthropic_provider_without_sdk_retries() -> None:
    provider = make_provider(
        "anthropic", api_key="sk-test", base_url=BASE_URL, model="claude-haiku-4-5"
    )
    assert isinstance(provider, AnthropicProvider)
    assert provider.name == "anthropic"
    assert provider.model == "claude-haiku-4-5"
    assert provider._client.max_retries == 0


def test_max_tokens_must_be_positive() -> None:
    with pytest.raises(LlmConfigError, match="max_tokens"):
        AnthropicProvider(api_key="sk-test", max_tokens=0)
