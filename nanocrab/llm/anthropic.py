"""The real model: Anthropic's Messages API through the ``anthropic`` SDK, streaming.

The SDK client is built with ``max_retries=0``: the LLM handler owns retries, so every attempt
is an event on the log. Every failure leaves as an :class:`LlmError` (see
:mod:`nanocrab.llm.anthropic_errors` for the rules).
"""

from __future__ import annotations

from typing import assert_never

import anthropic
import httpx2
from anthropic.types import (
    AssistantMessageParam,
    MessageParam,
    TextBlockParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
    UserMessageParam,
)

from nanocrab.events import (
    ContentBlock,
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from nanocrab.llm.anthropic_errors import (
    classify_connection_error,
    classify_status_error,
    classify_stream_error,
)
from nanocrab.llm.base import (
    DEFAULT_MODEL,
    DeltaSink,
    LlmConfigError,
    LlmError,
    Message,
    ModelRequest,
    ModelResponse,
)
from nanocrab.llm.pricing import cost_usd

DEFAULT_MAX_TOKENS = 4096


class AnthropicProvider:
    """``complete`` sends one streaming Messages request and returns the assembled response.

    ``model`` is used when the request names none; ``max_tokens`` caps the request's own
    ``max_tokens`` (a deployment-wide ceiling on output spend). ``api_key=None`` lets the SDK
    resolve credentials itself (``ANTHROPIC_API_KEY``, profiles); if it finds none, or a broken
    profile, the constructor raises :class:`LlmConfigError` instead of every call failing later.
    Pass ``client`` to supply a configured ``AsyncAnthropic`` (then ``api_key`` and ``base_url``
    are not used, and its retry setting is the caller's business).
    """

    name = "anthropic"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        model: str = DEFAULT_MODEL,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        client: anthropic.AsyncAnthropic | None = None,
    ) -> None:
        if max_tokens < 1:
            raise LlmConfigError(f"max_tokens must be at least 1, got {max_tokens}")
        if client is None:
            try:
                client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=0)
            except anthropic.CredentialsError as exc:
                raise LlmConfigError(f"cannot load Anthropic credentials: {exc}") from exc
        if client.api_key is None and client.auth_token is None and client.credentials is None:
            raise LlmConfigError(
                "no Anthropic credentials: set ANTHROPIC_API_KEY or pass api_key to the provider"
            )
        self.model = model
        self.max_tokens = max_tokens
        self._client = client

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        """Stream one call, forwarding text deltas to ``on_delta`` in arrival order.

        Raises :class:`LlmError` for every API, connection and stream failure. A stream that
        ends before the message is complete (no stop reason) is ``retryable``.
        """
        model = request.model or self.model
        system = [TextBlockParam(type="text", text=request.system)] if request.system else []
        tools = [
            ToolParam(name=t.name, description=t.description, input_schema=t.input_schema)
            for t in request.tools
        ]
        try:
            async with self._client.messages.stream(
                model=model,
                max_tokens=min(request.max_tokens, self.max_tokens),
                messages=to_message_params(request.messages),
                system=system or anthropic.omit,
                tools=tools or anthropic.omit,
            ) as stream:
                async for text in stream.text_stream:
                    if on_delta is not None:
                        await on_delta(text)
                message = await stream.get_final_message()
        except anthropic.APIStatusError as exc:
            raise classify_status_error(exc, model=model) from exc
        except anthropic.APIConnectionError as exc:
            raise classify_connection_error(exc, base_url=str(self._client.base_url)) from exc
        except httpx2.TransportError as exc:
            raise classify_stream_error(exc) from exc
        if message.stop_reason is None:
            raise LlmError("retryable", "the response stream ended before the message was complete")
        usage = Usage(
            input_tokens=message.usage.input_tokens,
            output_tokens=message.usage.output_tokens,
            cache_read_tokens=message.usage.cache_read_input_tokens or 0,
            cache_write_tokens=message.usage.cache_creation_input_tokens or 0,
        )
        return ModelResponse(
            content=from_sdk_message(message),
            stop_reason=message.stop_reason,
            usage=usage,
            model=message.model,
            cost_usd=cost_usd(message.model, usage),
        )


def to_message_params(messages: list[Message]) -> list[MessageParam]:
    """Our conversation as SDK request params. Empty text blocks are dropped: the API rejects them
    with a 400, and they carry nothing."""
    params: list[MessageParam] = []
    for message in messages:
        blocks = [p for block in message.content if (p := _block_param(block)) is not None]
        if message.role == "user":
            params.append(UserMessageParam(role="user", content=blocks))
        else:
            params.append(AssistantMessageParam(role="assistant", content=blocks))
    return params


def _block_param(
    block: ContentBlock | ToolResultBlock,
) -> TextBlockParam | ToolUseBlockParam | ToolResultBlockParam | None:
    match block:
        case TextBlock() | ImageBlock():
            return _text_param(block)
        case ToolUseBlock(id=id_, name=name, input=input_):
            return ToolUseBlockParam(type="tool_use", id=id_, name=name, input=input_)
        case ToolResultBlock():
            result = ToolResultBlockParam(
                type="tool_result", tool_use_id=block.tool_use_id, is_error=block.is_error
            )
            parts = [p for part in block.content if (p := _text_param(part)) is not None]
            if parts:
                result["content"] = parts
            return result
        case _:
            assert_never(block)


def _text_param(block: TextBlock | ImageBlock) -> TextBlockParam | None:
    if isinstance(block, ImageBlock):
        return TextBlockParam(type="text", text=image_placeholder(block))
    return TextBlockParam(type="text", text=block.text) if block.text else None


def image_placeholder(block: ImageBlock) -> str:
    """Images live in the object store and are not sent inline yet; the model is told one exists."""
    return f"[image {block.media_type} stored as artifact {block.artifact}; not shown]"


def from_sdk_message(message: anthropic.types.Message) -> list[ContentBlock]:
    """Text and tool-use blocks in our types. Other block types (thinking, server tools) only
    appear when a request enables them, which this provider never does; they are dropped."""
    blocks: list[ContentBlock] = []
    for block in message.content:
        if isinstance(block, anthropic.types.TextBlock):
            blocks.append(TextBlock(block.text))
        elif isinstance(block, anthropic.types.ToolUseBlock):
            if not isinstance(block.input, dict):
                raise LlmError(
                    "retryable", f"tool call {block.name!r} has input that is not a JSON object"
                )
            blocks.append(ToolUseBlock(id=block.id, name=block.name, input=block.input))
    return blocks
