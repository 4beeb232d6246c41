"""Value types nested inside event payloads."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class TextBlock(msgspec.Struct, frozen=True, tag="text"):
    text: str


class ToolUseBlock(msgspec.Struct, frozen=True, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ImageBlock(msgspec.Struct, frozen=True, tag="image"):
    media_type: str
    artifact: str  # object-store key; images never travel inline


class ToolResultBlock(msgspec.Struct, frozen=True, tag="tool_result", kw_only=True):
    """A tool's result as the model sees it (in a user turn, answering ``tool_use_id``)."""

    tool_use_id: str
    content: list[TextBlock | ImageBlock]
    is_error: bool = False


ContentBlock = TextBlock | ToolUseBlock | ImageBlock


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts as the provider reports them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class ArtifactRef(msgspec.Struct, frozen=True, kw_only=True):
    """A large payload kept in the JetStream Object Store; the event keeps a preview."""

    bucket: str
    key: str
    size: int
    sha256: str
    media_type: str = "application/octet-stream"
    preview: str = ""


class Capability(msgspec.Struct, frozen=True, kw_only=True):
    """One permission: a canonical tool name and, optionally, the resource or scope it covers."""

    tool: str
    resource: str | None = None  # a path, a host, or an API scope such as ``gmail.read``
    access: Literal["read", "write", "execute", "network", "any"] = "any"


RiskTier = Literal["safe", "guarded", "unsafe", "deny"]
GrantScope = Literal["task", "step", "resource"]
