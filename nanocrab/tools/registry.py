"""The tool registry: look tools up, describe them to the model, invoke them without raising."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from nanocrab.llm.base import ToolSpec
from nanocrab.sandbox import Sandbox
from nanocrab.tools.base import Tool, ToolContext, ToolError, ToolResult
from nanocrab.tools.edit import EditTool
from nanocrab.tools.globbing import GlobTool
from nanocrab.tools.grep import GrepTool
from nanocrab.tools.listing import LsTool
from nanocrab.tools.python import PythonTool
from nanocrab.tools.read import ReadTool
from nanocrab.tools.search import SearchProvider, WebSearchTool
from nanocrab.tools.shell import ExecTool
from nanocrab.tools.web import WebFetchTool
from nanocrab.tools.write import WriteTool

log = logging.getLogger(__name__)

COMPACT_CATALOGUE_ABOVE = 30
_LITERAL_KEYWORDS = frozenset({"default", "examples", "const", "enum"})
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


class ToolRegistry:
    """A fixed set of tools, ordered by ``(group, name)`` wherever it is listed, so prompts built
    from it are byte-stable whatever order the tools were registered in."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool
        self._order = sorted(self._tools, key=lambda n: (self._tools[n].group, n))
        self._specs: dict[str, ToolSpec] = {}

    def get(self, name: str) -> Tool:
        """The tool called ``name``; ``ToolError("unknown_tool")`` listing the others if none."""
        try:
            return self._tools[name]
        except KeyError:
            raise ToolError(
                "unknown_tool",
                f"There is no tool named {name!r}. Available tools: {', '.join(self._order)}.",
            ) from None

    def names(self) -> list[str]:
        """Every tool name, in catalogue order."""
        return list(self._order)

    def specs(self, names: Iterable[str] | None = None) -> list[ToolSpec]:
        """What the model is told about ``names`` (default: all), in catalogue order.

        Raises ``ToolError("unknown_tool")`` for a name that is not registered.
        """
        return [self._spec(tool) for tool in self._select(names)]

    def _spec(self, tool: Tool) -> ToolSpec:
        """Built once per tool: generating a JSON schema costs ~0.2 ms, on every model call."""
        spec = self._specs.get(tool.name)
        if spec is None:
            spec = ToolSpec(
                name=tool.name,
                description=tool.description,
                input_schema=_without_titles(tool.args_model.model_json_schema()),
            )
            self._specs[tool.name] = spec
        return spec

    def catalogue(self, names: Iterable[str] | None = None) -> str:
        """A compact list of ``names`` (default: all) for the system prompt, grouped by group.

        One line per tool (``name — first sentence of its description``); past
        ``COMPACT_CATALOGUE_ABOVE`` tools, one line per group listing only names.
        """
        tools = self._select(names)
        groups: dict[str, list[Tool]] = {}
        for tool in tools:
            groups.setdefault(tool.group, []).append(tool)
        lines: list[str] = []
        if len(tools) > COMPACT_CATALOGUE_ABOVE:
            for group, members in groups.items():
                lines.append(f"{group}: {', '.join(t.name for t in members)}")
            return "\n".join(lines)
        for group, members in groups.items():
            lines.append(f"{group}:")
            lines.extend(f"- {t.name} — {first_sentence(t.description)}" for t in members)
        return "\n".join(lines)

    async def invoke(self, name: str, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        """Validate ``arguments`` and run the tool. Never raises (except on cancellation of the
        calling task): every failure comes back as an error result of the matching kind, and an
        unexpected exception as ``internal`` (also logged with its traceback)."""
        try:
            tool = self.get(name)
        except ToolError as exc:
            return ToolResult.error(exc.kind, exc.message)
        try:
            args = tool.args_model.model_validate(arguments)
        except ValidationError as exc:
            return ToolResult.error("invalid_arguments", _describe(name, exc))
        if ctx.cancel.is_set():
            return ToolResult.error("aborted", f"{name} was not run: the run was cancelled.")
        try:
            return await tool.run(args, ctx)
        except ToolError as exc:
            return ToolResult.error(exc.kind, exc.message)
        except Exception as exc:
            log.exception("tool %s failed unexpectedly", name)
            return ToolResult.error(
                "internal", f"{name} failed unexpectedly: {type(exc).__name__}: {exc}"
            )

    def _select(self, names: Iterable[str] | None) -> list[Tool]:
        if names is None:
            return [self._tools[n] for n in self._order]
        wanted = set(names)
        for name in wanted:
            self.get(name)
        return [self._tools[n] for n in self._order if n in wanted]


def default_tools(
    *,
    web_allow: Sequence[str] = (),
    sandbox: Sandbox | None = None,
    search: SearchProvider | None = None,
) -> list[Tool]:
    """The host tools with their default limits; ``web_fetch`` reaches only ``web_allow``;
    ``python`` runs in the WebAssembly sandbox (compiled interpreter cached per user); with a
    ``search`` provider, also ``web_search`` (its API host must be in ``web_allow`` too)."""
    tools: list[Tool] = [
        ReadTool(), WriteTool(), EditTool(), LsTool(), GlobTool(), GrepTool(), ExecTool(),
        WebFetchTool(web_allow), PythonTool(sandbox=sandbox),
    ]  # fmt: skip
    if search is not None:
        tools.append(WebSearchTool(search, web_allow))
    return tools


def first_sentence(text: str) -> str:
    """The first sentence of the first line of ``text``."""
    line = text.strip().split("\n", 1)[0]
    return _SENTENCE_END.split(line, maxsplit=1)[0]


def _describe(name: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "(arguments)"
        problems.append(f"{where}: {err['msg']}")
    return f"Invalid arguments for {name}: " + "; ".join(problems) + "."


def _without_titles(schema: Any) -> Any:
    """``schema`` without pydantic's ``title`` keywords (property *names* are kept)."""
    if isinstance(schema, list):
        return [_without_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _LITERAL_KEYWORDS:
            out[key] = value
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties"):
            out[key] = {k: _without_titles(v) for k, v in value.items()}
        else:
            out[key] = _without_titles(value)
    return out
