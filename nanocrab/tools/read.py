"""The ``read`` tool: a window of a text file, with a hint where to continue."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from nanocrab.events import ReadDetails
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.paths import display_path, not_found, os_error, resolve_in_workspace
from nanocrab.tools.text import BOM, count_lines, looks_binary


class ReadArgs(ToolArgs):
    path: str = Field(description="File to read, relative to the workspace.")
    offset: int = Field(default=1, ge=1, description="First line to return (1-based).")
    limit: int = Field(default=2000, ge=1, description="Maximum number of lines to return.")


class ReadTool:
    """Reads at most ``limit`` lines and ``max_bytes`` bytes from ``offset`` on.

    Lines are returned as they are in the file, without line numbers, with CRLF shown as LF and a
    UTF-8 BOM dropped, so the text can be copied into ``edit``. When more follows, the content
    ends with ``[… N more lines; continue with offset=K]`` and ``ReadDetails.next_offset`` is K.
    A single line longer than ``max_bytes`` is cut, with a note saying so.
    """

    name: ClassVar[str] = "read"
    group: ClassVar[str] = "files"
    description: ClassVar[str] = (
        "Read a text file in the workspace. Returns up to `limit` lines (default 2000) and about "
        "50 KB starting at line `offset` (1-based); when the file is longer the output ends with "
        "the offset to continue from. Use grep to find the lines you need in large files."
    )
    args_model: ClassVar[type[ToolArgs]] = ReadArgs
    idempotent: ClassVar[bool] = True  # reads only: re-run after a crash

    def __init__(self, *, max_bytes: int = 50_000, max_file_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self.max_file_bytes = max_file_bytes

    async def run(self, args: ReadArgs, ctx: ToolContext) -> ToolResult:
        path = resolve_in_workspace(ctx.workspace, args.path)
        shown = display_path(ctx.workspace, path)
        try:
            info = await ctx.ops.stat(path, workspace=ctx.workspace)
        except OSError as exc:
            raise os_error(exc, shown) from exc
        if info is None:
            raise not_found(shown)
        if info.is_dir:
            raise ToolError("invalid_arguments", f"{shown} is a directory; use ls to list it.")
        if info.size > self.max_file_bytes:
            raise ToolError(
                "failed",
                f"{shown} is {info.size} bytes, more than read handles ({self.max_file_bytes}); "
                "use grep to find the lines you need, or exec with head/tail/sed.",
            )
        try:
            data = await ctx.ops.read_bytes(path, workspace=ctx.workspace)
        except OSError as exc:
            raise os_error(exc, shown) from exc
        if looks_binary(data):
            raise ToolError(
                "failed",
                f"{shown} is a binary file ({len(data)} bytes) and cannot be shown as text; "
                "use exec (e.g. `file`, `xxd | head`) to inspect it.",
            )
        text = data.decode("utf-8", errors="replace").removeprefix(BOM).replace("\r\n", "\n")
        return self._window(text, shown, args.offset, args.limit)

    def _window(self, text: str, shown: str, offset: int, limit: int) -> ToolResult:
        total = count_lines(text)
        if total == 0:
            details = ReadDetails(path=shown, offset=1, lines=0, total_lines=0)
            return ToolResult.text(f"({shown} is empty)", details=details)
        if offset > total:
            raise ToolError(
                "invalid_arguments",
                f"offset={offset} is past the end of {shown}, which has {total} lines.",
            )
        lines = text.split("\n", offset - 1 + limit)
        window = lines[offset - 1 : offset - 1 + limit]
        if offset - 1 + len(window) > total:
            window = window[: total - (offset - 1)]
        body = "\n".join(window)
        if len(body.encode()) < self.max_bytes:
            parts, note = window, ""
        else:
            parts, note = self._fit(window, offset)
            body = "\n".join(parts)
        last = offset - 1 + len(parts)
        truncated = last < total
        next_offset = last + 1 if truncated else None
        if note:
            body += "\n\n" + note
        if truncated:
            body += f"\n\n[… {total - last} more lines; continue with offset={next_offset}]"
        details = ReadDetails(
            path=shown, offset=offset, lines=len(parts), total_lines=total,
            truncated=truncated, next_offset=next_offset,
        )  # fmt: skip
        return ToolResult.text(body, details=details)

    def _fit(self, window: list[str], offset: int) -> tuple[list[str], str]:
        """The leading lines of ``window`` that fit ``max_bytes``, and a note when the first
        line alone does not fit and had to be cut."""
        parts: list[str] = []
        size = 0
        for line in window:
            cost = len(line.encode()) + 1
            if size + cost > self.max_bytes:
                break
            parts.append(line)
            size += cost
        if parts:
            return parts, ""
        first = window[0].encode()
        cut = first[: self.max_bytes].decode(errors="ignore")
        note = (
            f"[line {offset} is {len(first)} bytes; showing its first {len(cut.encode())}. "
            "Use grep or exec (e.g. `cut -c`) to see the rest.]"
        )
        return [cut], note
