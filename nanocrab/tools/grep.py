"""The ``grep`` tool: lines matching a regular expression, across a file or a tree."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from nanocrab.events import GrepDetails
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.globbing import PRUNED, compile_glob
from nanocrab.tools.ops import link_inside
from nanocrab.tools.paths import (
    display_path,
    not_found,
    os_error,
)
from nanocrab.tools.text import looks_binary


class GrepArgs(ToolArgs):
    pattern: str = Field(description="Python regular expression to search for.")
    path: str = Field(
        default=".", description="File or directory to search, relative to the workspace."
    )
    glob: str | None = Field(
        default=None,
        description=(
            "Only search files matching this glob, e.g. `*.py` (matched against the file name) "
            "or `src/**/*.ts` (matched against the path below `path`)."
        ),
    )
    ignore_case: bool = Field(default=False, description="Match case-insensitively.")


class GrepTool:
    """Searches text files line by line and answers ``file:line:text`` (paths relative to the
    workspace, files in a stable order, lines cut at ``max_line_chars``), at most ``max_matches``
    lines. Binary files, files over ``max_file_bytes``, ``.git``, and symlinks resolving outside
    the workspace are skipped. Finding nothing is not an error."""

    name: ClassVar[str] = "grep"
    group: ClassVar[str] = "files"
    description: ClassVar[str] = (
        "Search file contents for a regular expression (Python syntax). Returns matching lines "
        "as path:line:text. Narrow the search with `path` and `glob` (e.g. `*.py`)."
    )
    args_model: ClassVar[type[ToolArgs]] = GrepArgs
    idempotent: ClassVar[bool] = True  # reads only: re-run after a crash

    def __init__(
        self,
        *,
        max_matches: int = 200,
        max_line_chars: int = 300,
        max_file_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.max_matches = max_matches
        self.max_line_chars = max_line_chars
        self.max_file_bytes = max_file_bytes

    async def run(self, args: GrepArgs, ctx: ToolContext) -> ToolResult:
        try:
            regex = re.compile(args.pattern, re.IGNORECASE if args.ignore_case else 0)
        except re.error as exc:
            raise ToolError(
                "invalid_arguments",
                f"Invalid regular expression {args.pattern!r}: {exc}. Escape special characters "
                "such as ( [ . * + ? with a backslash to match them literally.",
            ) from exc
        wanted = _file_filter(args.glob)
        base = await ctx.ops.resolve(ctx.workspace, args.path)
        shown = display_path(ctx.workspace, base)
        lines: list[str] = []
        files = 0
        truncated = False
        try:
            info = await ctx.ops.stat(base, workspace=ctx.workspace)
            if info is None:
                raise not_found(shown)
            # aclosing: stopping early releases the walk's directory descriptors now
            async with aclosing(self._files(base, info.is_dir, wanted, ctx)) as found:
                async for path in found:
                    hits = await self._search(path, regex, ctx)
                    if not hits:
                        continue
                    files += 1
                    rel = display_path(ctx.workspace, path)
                    room = self.max_matches - len(lines)
                    lines.extend(f"{rel}:{n}:{text}" for n, text in hits[:room])
                    if len(hits) > room:
                        truncated = True
                        break
        except OSError as exc:
            raise os_error(exc, shown) from exc
        if not lines:
            body = f"No matches for {args.pattern!r} in {shown!r}."
        else:
            body = "\n".join(lines)
            if truncated:
                body += (
                    f"\n\n[match limit of {self.max_matches} reached; narrow the pattern, "
                    "path or glob to see the rest]"
                )
        details = GrepDetails(
            pattern=args.pattern, matches=len(lines), files=files, truncated=truncated
        )
        return ToolResult.text(body, details=details)

    async def _files(
        self, base: Path, is_dir: bool, wanted: Callable[[str], bool], ctx: ToolContext
    ) -> AsyncGenerator[Path, None]:
        if not is_dir:
            yield base
            return
        async with aclosing(ctx.ops.walk(base, workspace=ctx.workspace, prune=PRUNED)) as walk:
            async for entry in walk:
                if entry.is_dir or not wanted(entry.rel):
                    continue
                if entry.is_symlink and not await link_inside(
                    ctx.ops, entry.path, workspace=ctx.workspace
                ):
                    continue
                yield entry.path

    async def _search(
        self, path: Path, regex: re.Pattern[str], ctx: ToolContext
    ) -> list[tuple[int, str]]:
        try:
            info = await ctx.ops.stat(path, workspace=ctx.workspace)
            if info is None or info.is_dir or info.size > self.max_file_bytes:
                return []
            data = await ctx.ops.read_bytes(path, workspace=ctx.workspace)
        except OSError:
            return []
        if not data or looks_binary(data):
            return []
        text = data.decode("utf-8", errors="replace")
        hits: list[tuple[int, str]] = []
        for n, line in enumerate(text.removesuffix("\n").split("\n"), 1):
            line = line.removesuffix("\r")
            if regex.search(line):
                if len(line) > self.max_line_chars:
                    line = line[: self.max_line_chars] + "…"
                hits.append((n, line))
                if len(hits) > self.max_matches:
                    break
        return hits


def _file_filter(pattern: str | None) -> Callable[[str], bool]:
    """Patterns without ``/`` match the file name, others the path below the search root."""
    if pattern is None:
        return lambda rel: True
    matches = compile_glob(pattern)
    if "/" in pattern:
        return matches
    return lambda rel: matches(rel.rsplit("/", 1)[-1])
