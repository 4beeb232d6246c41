"""Glob patterns (``*``, ``?``, ``[...]``, ``**``, ``{a,b}``) and the ``glob`` tool.

Patterns match ``/``-separated paths relative to a base directory: ``*`` and ``?`` stay within
one path segment, a ``**`` segment matches any number of segments (none included), ``{a,b}``
matches either alternative. Leading dots are not special.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import ClassVar

from pydantic import Field

from nanocrab.events import GlobDetails
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult
from nanocrab.tools.ops import link_inside
from nanocrab.tools.paths import (
    display_path,
    not_found,
    os_error,
)

PRUNED = frozenset({".git"})


def compile_glob(pattern: str) -> Callable[[str], bool]:
    """A predicate telling whether a relative ``/``-separated path matches ``pattern``.

    Raises ``ToolError("invalid_arguments")`` for an empty or absolute pattern, or one that
    climbs out with ``..``.
    """
    if not pattern:
        raise ToolError("invalid_arguments", "The glob pattern is empty.")
    if pattern.startswith("/") or ".." in pattern.split("/"):
        raise ToolError(
            "invalid_arguments",
            f"Glob pattern {pattern!r} must be relative to `path` and must not contain '..'; "
            "set `path` to choose the directory to search.",
        )
    alternatives = "|".join(_translate(p) for p in expand_braces(pattern))
    regex = re.compile(f"(?:{alternatives})", re.DOTALL)
    return lambda rel: regex.fullmatch(rel) is not None


def expand_braces(pattern: str) -> list[str]:
    """``a{b,c}d`` → ``[abd, acd]``; nested braces expand too; unbalanced ones stay literal."""
    depth, start = 0, -1
    for i, ch in enumerate(pattern):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                head, body, tail = pattern[:start], pattern[start + 1 : i], pattern[i + 1 :]
                return [
                    expanded
                    for option in _split_top_level(body)
                    for expanded in expand_braces(head + option + tail)
                ]
    return [pattern]


def _split_top_level(body: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += (ch == "{") - (ch == "}")
        current += ch
    parts.append(current)
    return parts


def _translate(pattern: str) -> str:
    segments = [s for s in pattern.split("/") if s not in ("", ".")]
    out = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
        else:
            out.append(_translate_segment(segment) + ("" if last else "/"))
    return "".join(out)


def _translate_segment(segment: str) -> str:
    out, i = [], 0
    while i < len(segment):
        ch = segment[i]
        end = _class_end(segment, i) if ch == "[" else -1
        if ch == "*":
            while i + 1 < len(segment) and segment[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif end > 0:
            body = segment[i + 1 : end]
            negate = body[:1] in ("!", "^")
            members = "".join("\\" + c if c in "\\[]^&~|" else c for c in body[negate:])
            out.append(f"[{'^' if negate else ''}{members}]")
            i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def _class_end(segment: str, start: int) -> int:
    """Index of the ``]`` closing the class opened at ``start``, or -1 when it is not closed."""
    i = start + 1
    if segment[i : i + 1] in ("!", "^"):
        i += 1
    if segment[i : i + 1] == "]":
        i += 1
    return segment.find("]", i)


class GlobArgs(ToolArgs):
    pattern: str = Field(
        description="Glob pattern relative to `path`, e.g. `**/*.py`, `src/*.{ts,tsx}`."
    )
    path: str = Field(
        default=".", description="Directory to search from, relative to the workspace."
    )


class GlobTool:
    """Finds paths under ``path`` matching ``pattern``; results are relative to the workspace,
    sorted, at most ``max_results``, directories marked with a trailing ``/``. ``.git`` is not
    searched, directory symlinks are not followed, and symlinks resolving outside the workspace
    are left out."""

    name: ClassVar[str] = "glob"
    group: ClassVar[str] = "files"
    description: ClassVar[str] = (
        "Find files by glob pattern (`*`, `?`, `[abc]`, `**` for any depth, `{a,b}`). Returns "
        "matching paths relative to the workspace, sorted; directories end with /."
    )
    args_model: ClassVar[type[ToolArgs]] = GlobArgs
    idempotent: ClassVar[bool] = True  # reads only: re-run after a crash

    def __init__(self, *, max_results: int = 1000) -> None:
        self.max_results = max_results

    async def run(self, args: GlobArgs, ctx: ToolContext) -> ToolResult:
        matches = compile_glob(args.pattern)
        base = await ctx.ops.resolve(ctx.workspace, args.path)
        shown = display_path(ctx.workspace, base)
        found: list[str] = []
        try:
            info = await ctx.ops.stat(base, workspace=ctx.workspace)
            if info is None:
                raise not_found(shown)
            if not info.is_dir:
                raise ToolError(
                    "invalid_arguments", f"{shown} is a file; `path` must be a directory."
                )
            async for entry in ctx.ops.walk(base, workspace=ctx.workspace, prune=PRUNED):
                if not matches(entry.rel):
                    continue
                if entry.is_symlink and not await link_inside(
                    ctx.ops, entry.path, workspace=ctx.workspace
                ):
                    continue
                rel = display_path(ctx.workspace, entry.path)
                found.append(rel + "/" if entry.is_dir else rel)
        except OSError as exc:
            raise os_error(exc, shown) from exc
        found.sort()
        truncated = len(found) > self.max_results
        body = (
            "\n".join(found[: self.max_results]) or f"No paths match {args.pattern!r} in {shown!r}."
        )
        if truncated:
            body += (
                f"\n\n[… {len(found) - self.max_results} more matches not shown; "
                "use a narrower pattern or path]"
            )
        details = GlobDetails(pattern=args.pattern, matches=len(found), truncated=truncated)
        return ToolResult.text(body, details=details)
