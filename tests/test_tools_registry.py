"""ToolRegistry: lookups, model-facing specs, the prompt catalogue, and invoke never raising."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import msgspec
import pytest
from pydantic import Field

from nanocrab.agents import ALL_HOST_TOOLS
from nanocrab.events import TextBlock
from nanocrab.tools import (
    Tool,
    ToolArgs,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
    default_tools,
)
from tests.test_tools_support import make_ctx


class EchoArgs(ToolArgs):
    text: str = Field(description="What to echo.")
    times: int = Field(default=1, ge=1, le=3, description="How often.")


class Echo:
    name: ClassVar[str] = "echo"
    group: ClassVar[str] = "misc"
    description: ClassVar[str] = "Echo the text back. It is repeated `times` times."
    args_model: ClassVar[type[ToolArgs]] = EchoArgs
    idempotent: ClassVar[bool] = True

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, args: EchoArgs, ctx: ToolContext) -> ToolResult:
        self.calls += 1
        return ToolResult.text(args.text * args.times)


class NoArgs(ToolArgs):
    pass


def make_tool(name: str, group: str, description: str, error: Exception | None = None) -> Tool:
    class Made:
        args_model: ClassVar[type[ToolArgs]] = NoArgs
        idempotent: ClassVar[bool] = True

        async def run(self, args: NoArgs, ctx: ToolContext) -> ToolResult:
            if error is not None:
                raise error
            return ToolResult.text(name)

    Made.name = name  # type: ignore[misc]
    Made.group = group  # type: ignore[misc]
    Made.description = description  # type: ignore[misc]
    return Made()  # type: ignore[return-value]


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return make_ctx(tmp_path)


def text_of(result: ToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def test_invoke_runs_the_tool_with_validated_arguments(ctx: ToolContext) -> None:
    echo = Echo()
    result = await ToolRegistry([echo]).invoke("echo", {"text": "ab", "times": 2}, ctx)
    assert text_of(result) == "abab" and not result.is_error


async def test_invalid_arguments_name_the_bad_fields(ctx: ToolContext) -> None:
    echo = Echo()
    result = await ToolRegistry([echo]).invoke("echo", {"times": 9, "colour": "red"}, ctx)
    assert result.error_kind == "invalid_arguments"
    text = text_of(result)
    assert text.startswith("Invalid arguments for echo: ")
    assert "text: Field required" in text
    assert "times: Input should be less than or equal to 3" in text
    assert "colour: Extra inputs are not permitted" in text
    assert echo.calls == 0


async def test_non_mapping_arguments_are_invalid(ctx: ToolContext) -> None:
    result = await ToolRegistry([Echo()]).invoke("echo", ["text"], ctx)  # type: ignore[arg-type]
    assert result.error_kind == "invalid_arguments"


async def test_unknown_tool_lists_the_available_ones(ctx: ToolContext) -> None:
    registry = ToolRegistry([Echo(), make_tool("zed", "a", "Z.")])
    result = await registry.invoke("ech", {}, ctx)
    assert result.error_kind == "unknown_tool"
    assert text_of(result) == "There is no tool named 'ech'. Available tools: zed, echo."


async def test_tool_errors_keep_their_kind(ctx: ToolContext) -> None:
    tool = make_tool("t", "g", "T.", ToolError("not_found", "nope.txt does not exist"))
    result = await ToolRegistry([tool]).invoke("t", {}, ctx)
    assert (result.error_kind, text_of(result)) == ("not_found", "nope.txt does not exist")


async def test_unexpected_exceptions_become_internal_results(
    ctx: ToolContext, caplog: pytest.LogCaptureFixture
) -> None:
    tool = make_tool("t", "g", "T.", KeyError("boom"))
    result = await ToolRegistry([tool]).invoke("t", {}, ctx)
    assert result.error_kind == "internal"
    assert text_of(result) == "t failed unexpectedly: KeyError: 'boom'"
    assert "tool t failed unexpectedly" in caplog.text


async def test_cancelled_run_does_not_start_tools(ctx: ToolContext) -> None:
    echo = Echo()
    ctx.cancel.set()
    result = await ToolRegistry([echo]).invoke("echo", {"text": "x"}, ctx)
    assert result.error_kind == "aborted" and echo.calls == 0


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="'echo'"):
        ToolRegistry([Echo(), Echo()])


def test_get_and_names() -> None:
    echo = Echo()
    registry = ToolRegistry([make_tool("b", "z", "B."), echo, make_tool("a", "z", "A.")])
    assert registry.get("echo") is echo
    assert registry.names() == ["echo", "a", "b"]
    with pytest.raises(ToolError) as info:
        registry.get("nope")
    assert info.value.kind == "unknown_tool"


def test_specs_carry_the_json_schema_without_titles() -> None:
    [spec] = ToolRegistry([Echo()]).specs(["echo"])
    assert spec.name == "echo"
    assert spec.description == Echo.description
    assert spec.input_schema == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "text": {"type": "string", "description": "What to echo."},
            "times": {
                "type": "integer", "description": "How often.", "default": 1,
                "minimum": 1, "maximum": 3,
            },
        },
        "required": ["text"],
    }  # fmt: skip
    msgspec.json.encode(spec)


def test_specs_keep_a_property_called_title() -> None:
    class Args(ToolArgs):
        title: str = Field(description="A title.")

    tool = make_tool("t", "g", "T.")
    type(tool).args_model = Args  # type: ignore[misc]
    [spec] = ToolRegistry([tool]).specs()
    assert spec.input_schema["properties"] == {
        "title": {"type": "string", "description": "A title."}
    }


def test_specs_select_in_catalogue_order_and_reject_unknown_names() -> None:
    registry = ToolRegistry(default_tools())
    assert [s.name for s in registry.specs(["write", "exec", "read"])] == ["read", "write", "exec"]
    with pytest.raises(ToolError) as info:
        registry.specs(["read", "teleport"])
    assert info.value.kind == "unknown_tool" and "teleport" in info.value.message


def test_catalogue_is_grouped_and_independent_of_registration_order() -> None:
    tools = [
        make_tool("web_fetch", "web", "Fetch a page. Only allowed hosts."),
        make_tool("read", "files", "Read a file. Supports offsets."),
        make_tool("exec", "shell", "Run a command (sh -c).\nMore details."),
        make_tool("edit", "files", "Edit a file exactly once!  Then stop."),
    ]
    expected = (
        "files:\n"
        "- edit — Edit a file exactly once!\n"
        "- read — Read a file.\n"
        "shell:\n"
        "- exec — Run a command (sh -c).\n"
        "web:\n"
        "- web_fetch — Fetch a page."
    )
    assert ToolRegistry(tools).catalogue() == expected
    assert ToolRegistry(reversed(tools)).catalogue() == expected
    assert ToolRegistry(tools).catalogue(["exec", "read"]) == (
        "files:\n- read — Read a file.\nshell:\n- exec — Run a command (sh -c)."
    )


def test_large_catalogues_list_only_names() -> None:
    tools = [make_tool(f"t{i:02}", "bulk" if i % 2 else "alpha", f"Tool {i}.") for i in range(31)]
    catalogue = ToolRegistry(tools).catalogue()
    assert catalogue.split("\n") == [
        "alpha: " + ", ".join(f"t{i:02}" for i in range(0, 31, 2)),
        "bulk: " + ", ".join(f"t{i:02}" for i in range(1, 31, 2)),
    ]
    assert len(ToolRegistry(tools[:30]).catalogue().split("\n")) == 32


def test_default_tools_cover_the_host_tools_profiles_name() -> None:
    registry = ToolRegistry(default_tools(web_allow=["example.com"]))
    assert sorted(registry.names()) == sorted(ALL_HOST_TOOLS)
    assert registry.names() == [
        "edit", "glob", "grep", "ls", "read", "write", "python", "exec", "web_fetch",
    ]  # fmt: skip
    for spec in registry.specs():
        assert spec.input_schema["type"] == "object"
        for prop in spec.input_schema["properties"].values():
            assert prop.get("description"), (spec.name, prop)
    catalogue = registry.catalogue()
    assert catalogue.startswith("files:\n- edit — ")
    assert "\n- read — Read a text file in the workspace.\n" in catalogue
