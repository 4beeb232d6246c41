"""The ``skill`` tool: instructions with a resource list, resource text, typed failures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pydantic
import pytest

from nanocrab.events import ArtifactRef, SkillDetails, TextBlock
from nanocrab.skills import SkillArgs, SkillLibrary, SkillTool
from nanocrab.tools.base import ToolContext, ToolResult
from nanocrab.tools.registry import ToolRegistry

BODY = "# Alpha\n\n1. Read `references/guide.md`.\n2. Run `scripts/check.py`."


class NoArtifacts:
    async def put(
        self, name: str, data: bytes, *, media_type: str = "text/plain", preview: str = ""
    ) -> ArtifactRef:
        raise AssertionError("the skill tool stores no artifacts")


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    ops: Any = None  # the skill tool never touches the workspace
    return ToolContext(workspace=tmp_path, ops=ops, artifacts=NoArtifacts())


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    alpha = root / "alpha"
    (alpha / "references").mkdir(parents=True)
    (alpha / "scripts").mkdir()
    (alpha / "assets").mkdir()
    (alpha / "SKILL.md").write_text(
        f"---\nname: alpha\ndescription: Alpha. Use when testing.\n---\n\n{BODY}\n", "utf-8"
    )
    (alpha / "references" / "guide.md").write_text("# Guide\n\nDo the thing.\n", "utf-8")
    (alpha / "scripts" / "check.py").write_text("print('ok')\n", "utf-8")
    (alpha / "assets" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    (alpha / "assets" / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "secret.txt").write_text("TOP SECRET", "utf-8")
    beta = root / "beta"
    beta.mkdir()
    (beta / "SKILL.md").write_text(
        "---\nname: beta\ndescription: Beta.\n---\nBeta body.\n", "utf-8"
    )
    return root


@pytest.fixture
def tool(skills_dir: Path) -> SkillTool:
    return SkillTool(SkillLibrary.discover([skills_dir]))


def text_of(result: ToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def test_loading_a_skill_returns_its_body_and_resources(
    tool: SkillTool, ctx: ToolContext, skills_dir: Path
) -> None:
    result = await tool.run(SkillArgs(name="alpha"), ctx)

    assert not result.is_error
    text = text_of(result)
    assert BODY in text
    assert f"Directory: {(skills_dir / 'alpha').resolve()}" in text
    resources = text[text.index("## Resources") :].splitlines()
    assert resources[2:] == [
        "- assets/latin1.txt",
        "- assets/logo.png",
        "- references/guide.md",
        "- scripts/check.py",
    ]
    assert "Do the thing." not in text
    assert result.details == SkillDetails(name="alpha", bytes=len(BODY.encode()))


async def test_a_skill_without_resources_has_no_resource_section(
    tool: SkillTool, ctx: ToolContext
) -> None:
    result = await tool.run(SkillArgs(name="beta"), ctx)

    assert not result.is_error
    assert "Beta body." in text_of(result)
    assert "## Resources" not in text_of(result)


async def test_loading_a_resource_returns_its_text(tool: SkillTool, ctx: ToolContext) -> None:
    result = await tool.run(SkillArgs(name="alpha", resource="references/guide.md"), ctx)

    assert not result.is_error
    assert text_of(result) == "# Guide\n\nDo the thing.\n"
    assert result.details == SkillDetails(
        name="alpha", resource="references/guide.md", bytes=len(b"# Guide\n\nDo the thing.\n")
    )


async def test_an_unknown_skill_lists_the_available_ones(tool: SkillTool, ctx: ToolContext) -> None:
    for args in [SkillArgs(name="gamma"), SkillArgs(name="gamma", resource="x.md")]:
        result = await tool.run(args, ctx)

        assert result.is_error
        assert result.error_kind == "not_found"
        assert "'gamma'" in text_of(result)
        assert "alpha, beta" in text_of(result)


async def test_a_missing_resource_lists_the_skills_resources(
    tool: SkillTool, ctx: ToolContext
) -> None:
    result = await tool.run(SkillArgs(name="alpha", resource="references/nope.md"), ctx)

    assert result.is_error
    assert result.error_kind == "not_found"
    assert "references/guide.md" in text_of(result)
    assert "scripts/check.py" in text_of(result)


@pytest.mark.parametrize("relpath", ["../../secret.txt", "SECRET_ABSOLUTE", "link-out.txt"])
async def test_a_resource_path_leaving_the_skill_is_a_path_escape(
    tool: SkillTool, ctx: ToolContext, skills_dir: Path, relpath: str
) -> None:
    secret = skills_dir.parent / "secret.txt"
    os.symlink(secret, skills_dir / "alpha" / "link-out.txt")
    if relpath == "SECRET_ABSOLUTE":
        relpath = str(secret)

    result = await tool.run(SkillArgs(name="alpha", resource=relpath), ctx)

    assert result.is_error
    assert result.error_kind == "path_escape"
    assert "TOP SECRET" not in text_of(result)


@pytest.mark.parametrize("relpath", ["assets/logo.png", "assets/latin1.txt"])
async def test_a_binary_resource_is_a_clear_error(
    tool: SkillTool, ctx: ToolContext, skills_dir: Path, relpath: str
) -> None:
    result = await tool.run(SkillArgs(name="alpha", resource=relpath), ctx)

    assert result.is_error
    assert result.error_kind == "failed"
    assert "binary" in text_of(result)
    assert str((skills_dir / "alpha").resolve() / relpath) in text_of(result)
    size = (skills_dir / "alpha" / relpath).stat().st_size
    assert result.details == SkillDetails(name="alpha", resource=relpath, bytes=size)


async def test_a_large_resource_is_cut_with_a_note(skills_dir: Path, ctx: ToolContext) -> None:
    (skills_dir / "alpha" / "references" / "big.md").write_text("é" * 100, "utf-8")
    tool = SkillTool(SkillLibrary.discover([skills_dir]), max_resource_bytes=51)

    result = await tool.run(SkillArgs(name="alpha", resource="references/big.md"), ctx)

    assert not result.is_error
    shown, note = text_of(result).split("\n\n")
    assert shown == "é" * 25
    assert note == "[truncated: showed the first 51 of 200 bytes of references/big.md]"
    assert result.details == SkillDetails(name="alpha", resource="references/big.md", bytes=200)


async def test_a_skill_broken_after_discovery_is_a_failed_result(
    tool: SkillTool, ctx: ToolContext, skills_dir: Path
) -> None:
    (skills_dir / "alpha" / "SKILL.md").write_text("# frontmatter gone\n", "utf-8")

    result = await tool.run(SkillArgs(name="alpha"), ctx)

    assert result.is_error
    assert result.error_kind == "failed"
    assert "no YAML frontmatter" in text_of(result)


def test_the_tool_describes_itself_and_rejects_unknown_arguments() -> None:
    assert (SkillTool.name, SkillTool.group, SkillTool.args_model) == ("skill", "skills", SkillArgs)
    assert SkillTool.description.startswith("Load a skill's instructions by name before")
    schema = SkillArgs.model_json_schema()
    assert schema["required"] == ["name"]
    assert set(schema["properties"]) == {"name", "resource"}
    with pytest.raises(pydantic.ValidationError):
        SkillArgs.model_validate({"name": "alpha", "path": "x"})


async def test_the_tool_runs_through_the_tool_registry(tool: SkillTool, ctx: ToolContext) -> None:
    registry = ToolRegistry([tool])

    loaded = await registry.invoke("skill", {"name": "beta"}, ctx)
    refused = await registry.invoke("skill", {"skill": "beta"}, ctx)

    assert not loaded.is_error
    assert "Beta body." in text_of(loaded)
    assert refused.error_kind == "invalid_arguments"
