"""The ``remember`` and ``recall`` tools: the agent's own notes, and a search of its memory.

``remember`` changes nothing itself: the memory projection (``projections/memory.py``) folds the
note from the call's arguments once its ``tool.completed`` says it succeeded, so the note is in
the log and a rebuild finds it again. ``recall`` searches episodes, notes and session summaries
through an injected :class:`Search` (the projection in the runtime; the tools layer knows no
database), given the calling run's id: the runtime searches that run's tenant's memories only.
Both touch only the agent's own memory: Safe in the default policy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import ClassVar, Literal, Protocol

from pydantic import Field

from nanocrab.tools.base import ToolArgs, ToolContext, ToolResult

NOTE_CHARS = 2000


class Search(Protocol):
    """``(query, k, kind)`` for the run ``run_id`` → the lines of the best memories of that
    run's tenant, best first (none of another tenant's)."""

    def __call__(
        self, query: str, k: int, kind: str | None, *, run_id: str
    ) -> Awaitable[Sequence[str]]: ...


class RememberArgs(ToolArgs):
    text: str = Field(
        min_length=1,
        max_length=NOTE_CHARS,
        description="What to remember, self-contained (a fact, a decision, a fix).",
    )


class RememberTool:
    name: ClassVar[str] = "remember"
    group: ClassVar[str] = "memory"
    description: ClassVar[str] = (
        "Store a note in long-term memory, to be found later with `recall` (by meaning) and by "
        "future runs. Write it self-contained."
    )
    args_model: ClassVar[type[ToolArgs]] = RememberArgs
    idempotent: ClassVar[bool] = True  # the note is keyed by the call: a retry adds nothing

    async def run(self, args: RememberArgs, ctx: ToolContext) -> ToolResult:
        return ToolResult.text(f"Remembered ({len(args.text)} characters).")


class RecallArgs(ToolArgs):
    query: str = Field(min_length=1, description="What to look for, in your own words.")
    k: int = Field(default=5, ge=1, le=20, description="How many memories at most.")
    kind: Literal["episode", "note", "session"] | None = Field(
        default=None, description="Only earlier tasks (episode), notes, or session summaries."
    )


class RecallTool:
    name: ClassVar[str] = "recall"
    group: ClassVar[str] = "memory"
    description: ClassVar[str] = (
        "Search long-term memory by meaning: earlier tasks and their outcomes, notes stored "
        "with `remember`, summaries of past sessions. Returns the closest, best first."
    )
    args_model: ClassVar[type[ToolArgs]] = RecallArgs
    idempotent: ClassVar[bool] = True

    def __init__(self, search: Search) -> None:
        self._search = search

    async def run(self, args: RecallArgs, ctx: ToolContext) -> ToolResult:
        lines = await self._search(args.query, args.k, args.kind, run_id=ctx.run_id)
        if not lines:
            return ToolResult.text("Nothing in memory matches.")
        return ToolResult.text("\n".join(lines))
