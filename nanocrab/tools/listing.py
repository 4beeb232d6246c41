"""The ``ls`` tool: the entries of one directory."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from nanocrab.events import LsDetails
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.paths import display_path, os_error


class LsArgs(ToolArgs):
    path: str = Field(default=".", description="Directory to list, relative to the workspace.")


class LsTool:
    """Lists a directory sorted by name (case-insensitively), directories marked with a
    trailing ``/``, at most ``max_entries`` of them."""

    name: ClassVar[str] = "ls"
    group: ClassVar[str] = "files"
    description: ClassVar[str] = (
        "List a directory of the workspace (default: its root), sorted by name, with a "
        "trailing / on directories. Use glob to find files by pattern across directories."
    )
    args_model: ClassVar[type[ToolArgs]] = LsArgs
    idempotent: ClassVar[bool] = True  # reads only: re-run after a crash

    def __init__(self, *, max_entries: int = 500) -> None:
        self.max_entries = max_entries

    async def run(self, args: LsArgs, ctx: ToolContext) -> ToolResult:
        path = await ctx.ops.resolve(ctx.workspace, args.path)
        shown = display_path(ctx.workspace, path)
        try:
            info = await ctx.ops.stat(path, workspace=ctx.workspace)
            if info is not None and not info.is_dir:
                raise ToolError(
                    "invalid_arguments", f"{shown} is a file, not a directory; use read."
                )
            entries = await ctx.ops.list_dir(path, workspace=ctx.workspace)
        except OSError as exc:
            raise os_error(exc, shown) from exc
        entries.sort(key=lambda e: (e.name.lower(), e.name))
        names = [e.name + "/" if e.is_dir else e.name for e in entries[: self.max_entries]]
        truncated = len(entries) > self.max_entries
        body = "\n".join(names) if names else f"({shown} is empty)"
        if truncated:
            body += (
                f"\n\n[… {len(entries) - self.max_entries} more entries not shown; "
                "use glob with a narrower pattern]"
            )
        details = LsDetails(path=shown, entries=len(entries), truncated=truncated)
        return ToolResult.text(body, details=details)
