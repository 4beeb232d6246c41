"""glob (patterns and the tool) and grep on a real temporary workspace."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanocrab.events import GlobDetails, GrepDetails, TextBlock
from nanocrab.tools import (
    GlobArgs,
    GlobTool,
    GrepArgs,
    GrepTool,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
    compile_glob,
    default_tools,
)
from tests.test_tools_support import make_ctx


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    ws = tmp_path / "ws"
    ws.mkdir()
    for rel, text in {
        "README.md": "# Project\nTODO: write docs\n",
        "src/app.py": "import os\n\ndef main():\n    return os.getcwd()  # todo\n",
        "src/util/helpers.py": "def helper():\n    pass\n",
        "src/util/data.json": '{"todo": true}\n',
        "tests/test_app.py": "from src.app import main\n",
        ".git/config": "TODO in git internals\n",
    }.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    (ws / "blob.bin").write_bytes(b"TODO\x00\x01\x02")
    return make_ctx(ws)


def text_of(result: ToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def call(ctx: ToolContext, tool: str, **arguments: object) -> ToolResult:
    return await ToolRegistry(default_tools()).invoke(tool, arguments, ctx)


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.py", "a.py", True),
        ("*.py", "d/a.py", False),
        ("**/*.py", "a.py", True),
        ("**/*.py", "d/e/a.py", True),
        ("**/*.py", "d/a.pyc", False),
        ("src/**", "src/a/b", True),
        ("src/**/b.txt", "src/b.txt", True),
        ("src/**/b.txt", "src/x/y/b.txt", True),
        ("src/**/b.txt", "other/b.txt", False),
        ("src/*.py", "src/x/a.py", False),
        ("./src/*.py", "src/a.py", True),
        ("*.{ts,tsx}", "a.tsx", True),
        ("*.{ts,tsx}", "a.js", False),
        ("{src,lib}/**/*.{c,h}", "lib/x/y.h", True),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("[ab]*.md", "b.md", True),
        ("[!ab]*.md", "b.md", False),
        ("[!ab]*.md", "c.md", True),
        ("a+b(1).txt", "a+b(1).txt", True),
        ("*", ".hidden", True),
    ],
)
def test_compile_glob(pattern: str, path: str, expected: bool) -> None:
    assert compile_glob(pattern)(path) is expected


@pytest.mark.parametrize("pattern", ["", "/etc/*", "../*", "a/../../b"])
def test_compile_glob_rejects_escaping_patterns(pattern: str) -> None:
    with pytest.raises(ToolError) as info:
        compile_glob(pattern)
    assert info.value.kind == "invalid_arguments"


async def test_glob_finds_files_relative_to_the_workspace(ctx: ToolContext) -> None:
    result = await call(ctx, "glob", pattern="**/*.py")
    assert text_of(result) == "src/app.py\nsrc/util/helpers.py\ntests/test_app.py"
    assert result.details == GlobDetails(pattern="**/*.py", matches=3)
    under_src = await call(ctx, "glob", pattern="*", path="src")
    assert text_of(under_src) == "src/app.py\nsrc/util/"


async def test_glob_skips_git_and_reports_no_match(ctx: ToolContext) -> None:
    git = await call(ctx, "glob", pattern="**/config")
    assert git.details == GlobDetails(pattern="**/config", matches=0)
    result = await call(ctx, "glob", pattern="**/*.rs")
    assert not result.is_error and "No paths match" in text_of(result)


async def test_glob_caps_results(ctx: ToolContext) -> None:
    for i in range(20):
        (ctx.workspace / f"n{i:02}.txt").write_text("")
    result = await GlobTool(max_results=5).run(GlobArgs(pattern="n*.txt"), ctx)
    assert text_of(result).startswith("n00.txt\nn01.txt\nn02.txt\nn03.txt\nn04.txt\n\n[… 15 more")
    assert result.details == GlobDetails(pattern="n*.txt", matches=20, truncated=True)


async def test_glob_never_returns_paths_outside(ctx: ToolContext, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "leak.py").write_text("")
    (outside / "leak.py").write_text("")
    (ctx.workspace / "link.py").symlink_to(outside / "leak.py")
    (ctx.workspace / "linkdir").symlink_to(outside)
    (ctx.workspace / "inner.py").symlink_to(ctx.workspace / "src" / "app.py")
    text = text_of(await call(ctx, "glob", pattern="**/*"))
    assert "leak" not in text
    assert "link.py" not in text and "linkdir" not in text
    assert "inner.py" in text


async def test_glob_path_must_be_a_directory(ctx: ToolContext) -> None:
    assert (
        await call(ctx, "glob", pattern="*", path="README.md")
    ).error_kind == "invalid_arguments"
    assert (await call(ctx, "glob", pattern="*", path="missing")).error_kind == "not_found"


async def test_grep_reports_file_line_text(ctx: ToolContext) -> None:
    result = await call(ctx, "grep", pattern=r"TODO|todo")
    assert text_of(result) == (
        "README.md:2:TODO: write docs\n"
        "src/app.py:4:    return os.getcwd()  # todo\n"
        'src/util/data.json:1:{"todo": true}'
    )
    assert result.details == GrepDetails(pattern="TODO|todo", matches=3, files=3)


async def test_grep_ignore_case_glob_and_path(ctx: ToolContext) -> None:
    upper = await call(ctx, "grep", pattern="TODO")
    assert text_of(upper) == "README.md:2:TODO: write docs"
    folded = await call(ctx, "grep", pattern="TODO", ignore_case=True, glob="*.py")
    assert text_of(folded) == "src/app.py:4:    return os.getcwd()  # todo"
    scoped = await call(ctx, "grep", pattern="def", path="src/util")
    assert text_of(scoped) == "src/util/helpers.py:1:def helper():"
    one_file = await call(ctx, "grep", pattern="import", path="tests/test_app.py")
    assert text_of(one_file) == "tests/test_app.py:1:from src.app import main"
    by_path = await call(ctx, "grep", pattern="def", glob="src/**/*.py")
    assert text_of(by_path) == "src/app.py:3:def main():\nsrc/util/helpers.py:1:def helper():"


async def test_grep_skips_binary_and_git(ctx: ToolContext) -> None:
    text = text_of(await call(ctx, "grep", pattern="TODO", ignore_case=True))
    assert "blob.bin" not in text and ".git" not in text


async def test_grep_invalid_regex(ctx: ToolContext) -> None:
    result = await call(ctx, "grep", pattern="foo(")
    assert result.error_kind == "invalid_arguments"
    assert "foo(" in text_of(result)


async def test_grep_no_match_is_not_an_error(ctx: ToolContext) -> None:
    result = await call(ctx, "grep", pattern="zebra")
    assert not result.is_error
    assert result.details == GrepDetails(pattern="zebra", matches=0, files=0)


async def test_grep_caps_matches_and_long_lines(ctx: ToolContext) -> None:
    (ctx.workspace / "many.txt").write_text("hit\n" * 50 + "hit " + "x" * 1000 + "\n")
    capped = await GrepTool(max_matches=10).run(GrepArgs(pattern="hit", path="many.txt"), ctx)
    lines = text_of(capped).split("\n")
    assert lines[:10] == [f"many.txt:{i}:hit" for i in range(1, 11)]
    assert "match limit of 10" in text_of(capped)
    assert capped.details == GrepDetails(pattern="hit", matches=10, files=1, truncated=True)
    long = await GrepTool(max_line_chars=20).run(GrepArgs(pattern="x{100}", path="many.txt"), ctx)
    assert text_of(long) == "many.txt:51:hit " + "x" * 16 + "…"


async def test_grep_skips_symlinks_to_outside(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("TODO secret\n")
    (ctx.workspace / "leak.txt").symlink_to(tmp_path / "secret.txt")
    assert "secret" not in text_of(await call(ctx, "grep", pattern="TODO"))


async def test_grep_line_numbers_match_read_with_crlf(ctx: ToolContext) -> None:
    (ctx.workspace / "w.txt").write_bytes(b"a\r\nb\x0cc\r\nneedle\r\n")
    assert text_of(await call(ctx, "grep", pattern="needle$", path="w.txt")) == "w.txt:3:needle"
