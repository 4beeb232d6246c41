"""The real model: Anthropic's Messages API through the ``anthropic`` SDK, streaming.

The SDK client is built with ``max_retries=0``: the LLM handler owns retries, so every attempt
is an event on the log. Every failure leaves as an :class:`LlmError` (see
:mod:`nanocrab.llm.anthropic_errors` for the rules).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import Literal, assert_never, cast, get_args

import anthropic
import httpx2
from anthropic.types import (
    AssistantMessageParam,
    Base64ImageSourceParam,
    ImageBlockParam,
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
            ToolParam(
                name=wire_name(t.name), description=t.description, input_schema=t.input_schema
            )
            for t in request.tools
        ]
        names = {wire_name(t.name): t.name for t in request.tools}
        try:
            async with self._client.messages.stream(
                model=model,
                max_tokens=min(request.max_tokens, self.max_tokens),
                messages=to_message_params(request.messages, request.images),
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
            content=from_sdk_message(message, names),
            stop_reason=message.stop_reason,
            usage=usage,
            model=message.model,
            cost_usd=cost_usd(message.model, usage),
        )


_ImageType = Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
_IMAGE_TYPES = frozenset(get_args(_ImageType))
_WIRE_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NOT_WIRE = re.compile(r"[^a-zA-Z0-9_-]")


def to_message_params(
    messages: list[Message], images: Mapping[str, bytes] | None = None
) -> list[MessageParam]:
    """Our conversation as SDK request params. Empty text blocks are dropped: the API rejects them
    with a 400, and they carry nothing. An image block whose bytes are in ``images`` (by artifact
    key) is sent as a base64 image; one without, as a line saying it exists."""
    params: list[MessageParam] = []
    for message in messages:
        blocks = [
            p for block in message.content if (p := _block_param(block, images or {})) is not None
        ]
        if message.role == "user":
            params.append(UserMessageParam(role="user", content=blocks))
        else:
            params.append(AssistantMessageParam(role="assistant", content=blocks))
    return params


def _block_param(
    block: ContentBlock | ToolResultBlock, images: Mapping[str, bytes]
) -> TextBlockParam | ImageBlockParam | ToolUseBlockParam | ToolResultBlockParam | None:
    match block:
        case TextBlock() | ImageBlock():
            return _text_param(block, images)
        case ToolUseBlock(id=id_, name=name, input=input_):
            return ToolUseBlockParam(type="tool_use", id=id_, name=wire_name(name), input=input_)
        case ToolResultBlock():
            result = ToolResultBlockParam(
                type="tool_result", tool_use_id=block.tool_use_id, is_error=block.is_error
            )
            parts = [p for part in block.content if (p := _text_param(part, images)) is not None]
            if parts:
                result["content"] = parts
            return result
        case _:
            assert_never(block)


def _text_param(
    block: TextBlock | ImageBlock, images: Mapping[str, bytes]
) -> TextBlockParam | ImageBlockParam | None:
    if isinstance(block, ImageBlock):
        data = images.get(block.artifact)
        if data is None or block.media_type not in _IMAGE_TYPES:
            return TextBlockParam(type="text", text=image_placeholder(block))
        source = Base64ImageSourceParam(
            type="base64",
            media_type=cast(_ImageType, block.media_type),  # checked against _IMAGE_TYPES
            data=base64.b64encode(data).decode("ascii"),
        )
        return ImageBlockParam(type="image", source=source)
    return TextBlockParam(type="text", text=block.text) if block.text else None


def image_placeholder(block: ImageBlock) -> str:
    """An image whose bytes the call was not given (gone from the object store, or a type the
    API does not take): the model is told one exists."""
    return f"[image {block.media_type} stored as artifact {block.artifact}; not shown]"


def wire_name(name: str) -> str:
    """``name`` as the Messages API accepts tool names (``^[a-zA-Z0-9_-]{1,64}$``): a dotted
    name such as ``mcp.files.read_file`` becomes ``mcp__files__read_file``; a longer one keeps
    55 characters and a hash. Names the API accepts are unchanged."""
    if _WIRE_NAME.fullmatch(name):
        return name
    wire = _NOT_WIRE.sub("__", name)
    if len(wire) > 64:
        wire = f"{wire[:55]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return wire


def from_sdk_message(
    message: anthropic.types.Message, names: Mapping[str, str] | None = None
) -> list[ContentBlock]:
    """Text and tool-use blocks in our types; ``names`` maps the request's wire tool names back
    to ours (:func:`wire_name`). Other block types (thinking, server tools) only appear when a
    request enables them, which this provider never does; they are dropped."""
    blocks: list[ContentBlock] = []
    for block in message.content:
        if isinstance(block, anthropic.types.TextBlock):
            blocks.append(TextBlock(block.text))
        elif isinstance(block, anthropic.types.ToolUseBlock):
            if not isinstance(block.input, dict):
                raise LlmError(
                    "retryable", f"tool call {block.name!r} has input that is not a JSON object"
                )
            name = (names or {}).get(block.name, block.name)
            blocks.append(ToolUseBlock(id=block.id, name=name, input=block.input))
    return blocks
