"""read, write, edit and ls on a real temporary workspace."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nanocrab.events import EditDetails, LsDetails, ReadDetails, TextBlock, WriteDetails
from nanocrab.tools import (
    EditArgs,
    EditTool,
    LsArgs,
    LsTool,
    ReadArgs,
    ReadTool,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
    WriteArgs,
    WriteTool,
    default_tools,
)
from tests.test_tools_support import make_ctx


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return make_ctx(tmp_path)


def text_of(result: ToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def call(ctx: ToolContext, tool: str, **arguments: object) -> ToolResult:
    return await ToolRegistry(default_tools()).invoke(tool, arguments, ctx)


def numbered(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


# read


async def test_read_whole_small_file(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text("alpha\nbeta\n")
    result = await call(ctx, "read", path="f.txt")
    assert not result.is_error
    assert text_of(result) == "alpha\nbeta"
    assert result.details == ReadDetails(path="f.txt", offset=1, lines=2, total_lines=2)


async def test_read_window_with_continuation_hint(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text(numbered(10))
    result = await call(ctx, "read", path="f.txt", offset=3, limit=4)
    assert text_of(result) == (
        "line 3\nline 4\nline 5\nline 6\n\n[… 4 more lines; continue with offset=7]"
    )
    assert result.details == ReadDetails(
        path="f.txt", offset=3, lines=4, total_lines=10, truncated=True, next_offset=7
    )
    rest = await call(ctx, "read", path="f.txt", offset=7, limit=4)
    assert text_of(rest) == "line 7\nline 8\nline 9\nline 10"
    assert isinstance(rest.details, ReadDetails)
    assert rest.details.next_offset is None and not rest.details.truncated


async def test_read_default_limit_is_2000_lines(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text("x\n" * 2500)
    result = await call(ctx, "read", path="f.txt")
    assert isinstance(result.details, ReadDetails)
    assert (result.details.lines, result.details.next_offset) == (2000, 2001)
    assert text_of(result).endswith("[… 500 more lines; continue with offset=2001]")


async def test_read_byte_cap_truncates_on_a_line_boundary(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text(("y" * 99 + "\n") * 100)
    result = await ReadTool(max_bytes=1000).run(ReadArgs(path="f.txt"), ctx)
    assert isinstance(result.details, ReadDetails)
    assert result.details.lines == 10
    assert result.details.next_offset == 11
    assert text_of(result).endswith("[… 90 more lines; continue with offset=11]")


async def test_read_cuts_a_single_overlong_line_and_says_so(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text("z" * 5000 + "\nnext\n")
    result = await ReadTool(max_bytes=1000).run(ReadArgs(path="f.txt"), ctx)
    text = text_of(result)
    assert text.startswith("z" * 1000 + "\n")
    assert "line 1 is 5000 bytes" in text
    assert "continue with offset=2" in text


async def test_read_normalises_crlf_and_drops_bom(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n")
    assert text_of(await call(ctx, "read", path="f.txt")) == "one\ntwo"


async def test_read_empty_file(ctx: ToolContext) -> None:
    (ctx.workspace / "e.txt").write_text("")
    result = await call(ctx, "read", path="e.txt")
    assert not result.is_error and "empty" in text_of(result)


@pytest.mark.parametrize(
    ("setup", "arguments", "kind", "hint"),
    [
        (None, {"path": "nope.txt"}, "not_found", "ls or glob"),
        ("dir", {"path": "d"}, "invalid_arguments", "use ls"),
        ("binary", {"path": "b.bin"}, "failed", "binary"),
        ("text", {"path": "t.txt", "offset": 5}, "invalid_arguments", "has 2 lines"),
        ("text", {"path": "t.txt", "offset": 0}, "invalid_arguments", "offset"),
    ],
)
async def test_read_failures(
    ctx: ToolContext, setup: str | None, arguments: dict[str, object], kind: str, hint: str
) -> None:
    (ctx.workspace / "d").mkdir()
    (ctx.workspace / "b.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (ctx.workspace / "t.txt").write_text("a\nb\n")
    result = await call(ctx, "read", **arguments)
    assert result.is_error and result.error_kind == kind
    assert hint in text_of(result)


# write


async def test_write_creates_parents_then_overwrites(ctx: ToolContext) -> None:
    first = await call(ctx, "write", path="a/b/c.txt", content="héllo\n")
    assert first.details == WriteDetails(path="a/b/c.txt", bytes_written=7, created=True)
    assert (ctx.workspace / "a/b/c.txt").read_bytes() == "héllo\n".encode()
    second = await call(ctx, "write", path="a/b/c.txt", content="bye")
    assert second.details == WriteDetails(path="a/b/c.txt", bytes_written=3, created=False)
    assert (ctx.workspace / "a/b/c.txt").read_text() == "bye"
    assert os.listdir(ctx.workspace / "a/b") == ["c.txt"]


async def test_write_keeps_the_mode_of_an_existing_file(ctx: ToolContext) -> None:
    script = ctx.workspace / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o750)
    await WriteTool().run(WriteArgs(path="run.sh", content="#!/bin/sh\necho hi\n"), ctx)
    assert stat.S_IMODE(script.stat().st_mode) == 0o750


async def test_write_to_a_directory_fails(ctx: ToolContext) -> None:
    (ctx.workspace / "d").mkdir()
    result = await call(ctx, "write", path="d", content="x")
    assert result.error_kind == "invalid_arguments"
    assert (ctx.workspace / "d").is_dir()


# edit


async def test_edit_replaces_the_unique_match_and_returns_a_diff(ctx: ToolContext) -> None:
    (ctx.workspace / "m.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    result = await call(ctx, "edit", path="m.py", old_text="    return 2", new_text="    return 3")
    assert not result.is_error
    assert (ctx.workspace / "m.py").read_text() == (
        "def f():\n    return 1\n\n\ndef g():\n    return 3\n"
    )
    assert isinstance(result.details, EditDetails)
    assert result.details.first_changed_line == 6
    assert result.details.diff.startswith("--- a/m.py\n+++ b/m.py\n@@ -3,4 +3,4 @@")
    assert "-    return 2\n+    return 3" in result.details.diff
    assert result.details.diff in text_of(result)


async def test_edit_first_changed_line_skips_unchanged_context(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text("a\nb\nc\nd\n")
    result = await EditTool().run(EditArgs(path="f.txt", old_text="b\nc", new_text="b\nC"), ctx)
    assert isinstance(result.details, EditDetails)
    assert result.details.first_changed_line == 3


async def test_edit_ambiguous_match_changes_nothing(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text("x = 1\nx = 1\nx = 1\n")
    result = await call(ctx, "edit", path="f.txt", old_text="x = 1", new_text="x = 2")
    assert result.error_kind == "failed"
    assert "3 times" in text_of(result) and "surrounding lines" in text_of(result)
    assert (ctx.workspace / "f.txt").read_text() == "x = 1\nx = 1\nx = 1\n"


async def test_edit_missing_text_changes_nothing(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text("hello\n")
    result = await call(ctx, "edit", path="f.txt", old_text="goodbye", new_text="x")
    assert result.error_kind == "failed"
    assert "not found" in text_of(result) and "read the file again" in text_of(result).lower()
    assert (ctx.workspace / "f.txt").read_text() == "hello\n"


async def test_edit_hints_at_whitespace_differences(ctx: ToolContext) -> None:
    (ctx.workspace / "f.py").write_text("if x:\n    y()\n")
    result = await call(ctx, "edit", path="f.py", old_text="if x:\n  y()", new_text="if x:\n  z()")
    assert result.error_kind == "failed" and "whitespace" in text_of(result)


async def test_edit_preserves_crlf_and_bom(ctx: ToolContext) -> None:
    path = ctx.workspace / "win.txt"
    path.write_bytes(b"\xef\xbb\xbffirst\r\nsecond\r\nthird\r\n")
    result = await call(ctx, "edit", path="win.txt", old_text="second\nthird", new_text="2nd\n3rd")
    assert not result.is_error, result
    assert path.read_bytes() == b"\xef\xbb\xbffirst\r\n2nd\r\n3rd\r\n"
    assert isinstance(result.details, EditDetails)
    assert result.details.first_changed_line == 2
    assert "\r" not in result.details.diff


async def test_edit_keeps_lf_files_lf(ctx: ToolContext) -> None:
    path = ctx.workspace / "unix.txt"
    path.write_bytes(b"a\nb\n")
    await call(ctx, "edit", path="unix.txt", old_text="a\r\nb", new_text="A\r\nB")
    assert path.read_bytes() == b"A\nB\n"


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [
        ({"path": "nope.txt", "old_text": "a", "new_text": "b"}, "not_found"),
        ({"path": "f.txt", "old_text": "same", "new_text": "same"}, "invalid_arguments"),
        ({"path": "f.txt", "old_text": "", "new_text": "b"}, "invalid_arguments"),
        ({"path": "bin.dat", "old_text": "a", "new_text": "b"}, "failed"),
        ({"path": "latin1.txt", "old_text": "caf", "new_text": "tea"}, "failed"),
    ],
)
async def test_edit_failures(ctx: ToolContext, arguments: dict[str, str], kind: str) -> None:
    (ctx.workspace / "f.txt").write_text("same\n")
    (ctx.workspace / "bin.dat").write_bytes(b"a\x00b")
    (ctx.workspace / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    result = await call(ctx, "edit", **arguments)
    assert result.error_kind == kind, result
    assert (ctx.workspace / "f.txt").read_text() == "same\n"
    assert (ctx.workspace / "latin1.txt").read_bytes() == "café\n".encode("latin-1")


# ls


async def test_ls_sorts_and_marks_directories(ctx: ToolContext) -> None:
    for name in ("b.txt", "A.txt", ".hidden"):
        (ctx.workspace / name).write_text("x")
    (ctx.workspace / "sub").mkdir()
    (ctx.workspace / "sub" / "inner.txt").write_text("x")
    result = await call(ctx, "ls")
    assert text_of(result) == ".hidden\nA.txt\nb.txt\nsub/"
    assert result.details == LsDetails(path=".", entries=4)
    assert text_of(await call(ctx, "ls", path="sub")) == "inner.txt"


async def test_ls_caps_entries(ctx: ToolContext) -> None:
    for i in range(12):
        (ctx.workspace / f"f{i:02}").write_text("")
    result = await LsTool(max_entries=5).run(LsArgs(), ctx)
    assert text_of(result).startswith("f00\nf01\nf02\nf03\nf04\n\n[… 7 more entries")
    assert result.details == LsDetails(path=".", entries=12, truncated=True)


async def test_ls_failures(ctx: ToolContext) -> None:
    (ctx.workspace / "f.txt").write_text("x")
    assert (await call(ctx, "ls", path="missing")).error_kind == "not_found"
    assert (await call(ctx, "ls", path="f.txt")).error_kind == "invalid_arguments"


async def test_ls_of_empty_directory(ctx: ToolContext) -> None:
    result = await call(ctx, "ls")
    assert not result.is_error and "empty" in text_of(result)


async def test_read_tool_raises_typed_errors_directly(ctx: ToolContext) -> None:
    with pytest.raises(ToolError) as info:
        await ReadTool().run(ReadArgs(path="missing.txt"), ctx)
    assert info.value.kind == "not_found"


async def test_write_through_a_symlink_inside_updates_its_target(ctx: ToolContext) -> None:
    (ctx.workspace / "real.txt").write_text("old")
    (ctx.workspace / "alias.txt").symlink_to(ctx.workspace / "real.txt")
    result = await call(ctx, "write", path="alias.txt", content="new")
    assert result.details == WriteDetails(path="real.txt", bytes_written=3, created=False)
    assert (ctx.workspace / "alias.txt").is_symlink()
    assert (ctx.workspace / "real.txt").read_text() == "new"
