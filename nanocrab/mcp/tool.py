"""An MCP server's tool as an agent tool: ``mcp.<server>.<tool>`` with the server's JSON schema.

The agent-facing name is canonical (lower case, ``[a-z0-9_.-]``, so a policy rule can name it):
the server's own name is kept in :attr:`McpTool.remote` for the call. Arguments are checked
against the server's ``inputSchema`` before anything is sent (``invalid_arguments``); the result
maps to content blocks — text as text, images and binary resources to the artifact store (an
``ImageBlock`` names its artifact), resource links as a line of text — and the server's
``isError`` to ``error_kind="failed"``. A call that got no result is the
:class:`~nanocrab.mcp.client.McpCallError`'s kind (``unavailable``, ``timeout``, ``aborted``).

No call is idempotent: a server's ``readOnlyHint`` is its own claim, and a call interrupted by a
crash is reported, never silently run again.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, ClassVar

import jsonschema
from mcp import types as mt
from pydantic import ConfigDict

from nanocrab.events import ImageBlock, TextBlock
from nanocrab.mcp.client import McpCallError, McpHub
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult

PREFIX = "mcp"
_UNSAFE = re.compile(r"[^a-z0-9_-]+")
_MAX_DESCRIPTION = 2000


def agent_name(server: str, tool: str) -> str:
    """``mcp.<server>.<tool>`` with the tool's name folded to the canonical alphabet."""
    folded = _UNSAFE.sub("_", tool.lower()).strip("_") or "tool"
    return f"{PREFIX}.{server}.{folded}"


class McpArgs(ToolArgs):
    """Base of an MCP tool's arguments: anything goes through pydantic (the server's schema is
    checked with jsonschema in :meth:`McpTool.run`); ``input_schema`` is what the model sees."""

    model_config = ConfigDict(extra="allow")
    input_schema: ClassVar[dict[str, Any]] = {"type": "object"}

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return cls.input_schema


class McpTool:
    """One remote tool; calls go through ``hub`` (the executor's sessions). Build with
    :meth:`of`: each remote tool gets a class of its own, since a tool's name, description and
    schema are class attributes (:class:`~nanocrab.tools.base.Tool`)."""

    name: ClassVar[str] = PREFIX
    group: ClassVar[str] = "mcp"
    description: ClassVar[str] = ""
    args_model: ClassVar[type[ToolArgs]] = McpArgs
    idempotent: ClassVar[bool] = False
    server: ClassVar[str] = ""
    remote: ClassVar[str] = ""  # the tool's name on its server
    schema: ClassVar[dict[str, Any]] = {"type": "object"}

    def __init__(self, hub: McpHub) -> None:
        self.hub = hub
        self._validator: jsonschema.protocols.Validator | None = None
        try:
            validator = jsonschema.validators.validator_for(self.schema)(self.schema)
            validator.check_schema(self.schema)
            self._validator = validator
        except jsonschema.SchemaError:
            pass  # the server's problem: it validates its own input

    @classmethod
    def of(cls, hub: McpHub, server: str, tool: mt.Tool) -> McpTool:
        """The agent tool for ``tool`` of ``server``."""
        text = (tool.description or "").strip()[:_MAX_DESCRIPTION] or tool.name
        schema = dict(tool.inputSchema) if tool.inputSchema else {"type": "object"}
        schema.setdefault("type", "object")
        name = agent_name(server, tool.name)
        args = type(f"McpArgs[{name}]", (McpArgs,), {"input_schema": schema})
        attrs = {
            "name": name, "description": f"[MCP server {server}] {text}", "args_model": args,
            "server": server, "remote": tool.name, "schema": schema,
        }  # fmt: skip
        sub: type[McpTool] = type(f"McpTool[{name}]", (cls,), attrs)
        return sub(hub)

    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        arguments: dict[str, Any] = args.model_dump() if isinstance(args, ToolArgs) else dict(args)
        if self._validator is not None:
            problems = [
                f"{'.'.join(str(p) for p in e.absolute_path) or '(arguments)'}: {e.message}"
                for e in self._validator.iter_errors(arguments)
            ]
            if problems:
                raise ToolError(
                    "invalid_arguments",
                    f"Invalid arguments for {self.name}: {'; '.join(problems[:5])}.",
                )
        try:
            result = await self.hub.connection(self.server).call(
                self.remote,
                arguments,
                time_limit=min(self.hub.config.call_timeout, ctx.timeout_s),
                cancel=ctx.cancel,
            )
        except McpCallError as exc:
            raise ToolError(exc.kind, exc.message) from exc
        content = await _blocks(result, ctx, self.name)
        if result.isError:
            return ToolResult(content=content, is_error=True, error_kind="failed")
        return ToolResult(content=content)


async def _blocks(
    result: mt.CallToolResult, ctx: ToolContext, tool: str
) -> list[TextBlock | ImageBlock]:
    out: list[TextBlock | ImageBlock] = []
    for i, block in enumerate(result.content):
        match block:
            case mt.TextContent(text=text):
                out.append(TextBlock(text))
            case mt.ImageContent(data=data, mimeType=mime):
                ref = await ctx.artifacts.put(
                    f"{tool}-{ctx.call_id}-{i}", _decode(data), media_type=mime
                )
                out.append(ImageBlock(media_type=mime, artifact=ref.key))
            case mt.AudioContent(data=data, mimeType=mime):
                ref = await ctx.artifacts.put(
                    f"{tool}-{ctx.call_id}-{i}", _decode(data), media_type=mime
                )
                out.append(TextBlock(f"[audio {mime}, stored as artifact {ref.key}]"))
            case mt.ResourceLink(uri=uri, name=name):
                out.append(TextBlock(f"[resource {name}: {uri}]"))
            case mt.EmbeddedResource(resource=mt.TextResourceContents(uri=uri, text=text)):
                out.append(TextBlock(f"[resource {uri}]\n{text}"))
            case mt.EmbeddedResource(resource=mt.BlobResourceContents(uri=uri) as blob):
                mime = blob.mimeType or "application/octet-stream"
                ref = await ctx.artifacts.put(
                    f"{tool}-{ctx.call_id}-{i}", _decode(blob.blob), media_type=mime
                )
                out.append(TextBlock(f"[resource {uri} ({mime}), stored as artifact {ref.key}]"))
    if not out and result.structuredContent is not None:
        out.append(TextBlock(json.dumps(result.structuredContent, ensure_ascii=False)))
    return out or [TextBlock("(no content)")]


def _decode(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ToolError("failed", f"the server sent content that is not base64: {exc}") from exc


RESOURCE_TOOL = "resources.read"  # mcp.<server>.resources.read: agent_name never makes a dot
_LISTED = 40


class ReadResourceArgs(ToolArgs):
    uri: str


class McpResourceTool:
    """``mcp.<server>.resources.read``: read one of a server's resources by URI. Its
    description lists the server's resources and URI templates (so they are in the tool
    catalogue, and screened with it); calls go through the policy like any MCP tool."""

    name: ClassVar[str] = PREFIX
    group: ClassVar[str] = "mcp"
    description: ClassVar[str] = ""
    args_model: ClassVar[type[ToolArgs]] = ReadResourceArgs
    idempotent: ClassVar[bool] = False
    server: ClassVar[str] = ""

    def __init__(self, hub: McpHub) -> None:
        self.hub = hub

    @staticmethod
    def describe(
        server: str, resources: list[mt.Resource], templates: list[mt.ResourceTemplate]
    ) -> str:
        lines = [f"[MCP server {server}] Read a resource of this server by its URI. Resources:"]
        for r in resources[:_LISTED]:
            about = f" — {r.description.strip()}" if r.description else ""
            lines.append(f"- {r.uri} ({r.name}){about}")
        if len(resources) > _LISTED:
            lines.append(f"- … and {len(resources) - _LISTED} more")
        for t in templates[:_LISTED]:
            about = f" — {t.description.strip()}" if t.description else ""
            lines.append(f"- template {t.uriTemplate} ({t.name}){about}")
        return "\n".join(lines)[: 4 * _MAX_DESCRIPTION]

    @classmethod
    def of(cls, hub: McpHub, server: str, description: str) -> McpResourceTool:
        name = f"{PREFIX}.{server}.{RESOURCE_TOOL}"
        attrs = {"name": name, "description": description, "server": server}
        sub: type[McpResourceTool] = type(f"McpResourceTool[{name}]", (cls,), attrs)
        return sub(hub)

    async def run(self, args: ReadResourceArgs, ctx: ToolContext) -> ToolResult:
        try:
            result = await self.hub.connection(self.server).read(
                args.uri,
                time_limit=min(self.hub.config.call_timeout, ctx.timeout_s),
                cancel=ctx.cancel,
            )
        except McpCallError as exc:
            raise ToolError(exc.kind, exc.message) from exc
        out: list[TextBlock | ImageBlock] = []
        for i, item in enumerate(result.contents):
            if isinstance(item, mt.TextResourceContents):
                out.append(TextBlock(item.text))
                continue
            mime = item.mimeType or "application/octet-stream"
            ref = await ctx.artifacts.put(
                f"{self.name}-{ctx.call_id}-{i}", _decode(item.blob), media_type=mime
            )
            if mime.startswith("image/"):
                out.append(ImageBlock(media_type=mime, artifact=ref.key))
            else:
                out.append(TextBlock(f"[{item.uri} ({mime}), stored as artifact {ref.key}]"))
        return ToolResult(content=out or [TextBlock("(empty resource)")])
