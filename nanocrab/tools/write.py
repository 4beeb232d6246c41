"""The ``write`` tool: create or replace a whole file."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from nanocrab.events import WriteDetails
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.paths import display_path, os_error


class WriteArgs(ToolArgs):
    path: str = Field(description="File to write, relative to the workspace.")
    content: str = Field(description="The complete new content of the file.")


class WriteTool:
    """Writes ``content`` as UTF-8, atomically, creating parent directories as needed."""

    name: ClassVar[str] = "write"
    group: ClassVar[str] = "files"
    description: ClassVar[str] = (
        "Create a file or replace its whole content. Parent directories are created. "
        "Prefer edit for changing part of an existing file."
    )
    args_model: ClassVar[type[ToolArgs]] = WriteArgs
    idempotent: ClassVar[bool] = False  # changes a file

    async def run(self, args: WriteArgs, ctx: ToolContext) -> ToolResult:
        path = await ctx.ops.resolve(ctx.workspace, args.path)
        shown = display_path(ctx.workspace, path)
        data = args.content.encode()
        try:
            info = await ctx.ops.stat(path, workspace=ctx.workspace)
            if info is not None and info.is_dir:
                raise ToolError(
                    "invalid_arguments", f"{shown} is a directory; give a file path to write."
                )
            await ctx.ops.write_bytes(path, data, workspace=ctx.workspace)
        except OSError as exc:
            raise os_error(exc, shown) from exc
        created = info is None
        verb = "Created" if created else "Wrote"
        details = WriteDetails(path=shown, bytes_written=len(data), created=created)
        return ToolResult.text(f"{verb} {shown} ({len(data)} bytes).", details=details)
