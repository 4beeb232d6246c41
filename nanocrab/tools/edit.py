"""The ``edit`` tool: replace one exact passage of a file and show the diff."""

from __future__ import annotations

import difflib
from typing import ClassVar

from pydantic import Field

from nanocrab.events import EditDetails
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.paths import display_path, not_found, os_error
from nanocrab.tools.text import BOM, looks_binary


class EditArgs(ToolArgs):
    path: str = Field(description="File to edit, relative to the workspace.")
    old_text: str = Field(
        min_length=1,
        description=(
            "Exact text to replace, including whitespace and indentation; it must occur exactly "
            "once in the file, so include enough surrounding lines to make it unique."
        ),
    )
    new_text: str = Field(description="Text to put in its place (may be empty to delete).")


class EditTool:
    """Replaces the single occurrence of ``old_text`` with ``new_text``.

    Matching runs on a view of the file with CRLF normalised to LF and any UTF-8 BOM removed
    (the view ``read`` shows); the result is written back with the file's own line endings and
    BOM. Zero or several occurrences fail with ``failed`` and change nothing. The content is a
    unified diff of the change; ``EditDetails.first_changed_line`` is 1-based in the new file.
    """

    name: ClassVar[str] = "edit"
    group: ClassVar[str] = "files"
    description: ClassVar[str] = (
        "Replace one exact occurrence of `old_text` with `new_text` in a file and return the "
        "diff. `old_text` must match the file exactly (whitespace included) and occur once; "
        "read the file first and copy the passage with a few lines of context."
    )
    args_model: ClassVar[type[ToolArgs]] = EditArgs
    idempotent: ClassVar[bool] = False  # changes a file

    async def run(self, args: EditArgs, ctx: ToolContext) -> ToolResult:
        path = await ctx.ops.resolve(ctx.workspace, args.path)
        shown = display_path(ctx.workspace, path)
        try:
            info = await ctx.ops.stat(path, workspace=ctx.workspace)
            if info is None:
                raise not_found(shown)
            data = await ctx.ops.read_bytes(path, workspace=ctx.workspace)
        except OSError as exc:
            raise os_error(exc, shown) from exc
        if looks_binary(data):
            raise ToolError("failed", f"{shown} is a binary file; edit changes text files only.")
        try:
            raw = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolError(
                "failed",
                f"{shown} is not valid UTF-8 (byte {exc.start}); editing it as text would "
                "corrupt it. Use exec with a tool that handles its encoding.",
            ) from exc
        bom = BOM if raw.startswith(BOM) else ""
        crlf = "\r\n" in raw
        old = raw.removeprefix(bom).replace("\r\n", "\n")
        needle = args.old_text.replace("\r\n", "\n")
        replacement = args.new_text.replace("\r\n", "\n")
        if needle == replacement:
            raise ToolError(
                "invalid_arguments", "old_text and new_text are identical; nothing to do."
            )
        _check_unique(old, needle, shown)
        new = old.replace(needle, replacement, 1)
        out = new.replace("\n", "\r\n") if crlf else new
        try:
            await ctx.ops.write_bytes(path, (bom + out).encode(), workspace=ctx.workspace)
        except OSError as exc:
            raise os_error(exc, shown) from exc
        diff = unified_diff(old, new, shown)
        details = EditDetails(
            path=shown, diff=diff, first_changed_line=first_changed_line(old, new)
        )
        return ToolResult.text(f"Edited {shown}.\n{diff}", details=details)


def _check_unique(text: str, needle: str, shown: str) -> None:
    count = text.count(needle)
    if count == 1:
        return
    if count > 1:
        raise ToolError(
            "failed",
            f"old_text occurs {count} times in {shown}; include more surrounding lines so it "
            "matches exactly once. Nothing was changed.",
        )
    hint = "Read the file again and copy the passage exactly."
    squeezed = " ".join(needle.split())
    if squeezed and squeezed in " ".join(text.split()):
        hint = (
            "A passage differing only in whitespace exists; read the file again and copy its "
            "exact indentation and spacing."
        )
    raise ToolError("failed", f"old_text was not found in {shown}. {hint} Nothing was changed.")


def unified_diff(old: str, new: str, shown: str) -> str:
    """A unified diff of two versions of a file, with 3 lines of context."""
    lines = difflib.unified_diff(
        old.splitlines(), new.splitlines(), fromfile=f"a/{shown}", tofile=f"b/{shown}", lineterm=""
    )
    return "\n".join(lines)


def first_changed_line(old: str, new: str) -> int:
    """The 1-based number, in ``new``, of the first line that differs from ``old``."""
    old_lines, new_lines = old.split("\n"), new.split("\n")
    for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=False)):
        if a != b:
            return i + 1
    return min(len(old_lines), len(new_lines)) + 1
