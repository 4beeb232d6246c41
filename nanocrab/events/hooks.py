"""What an extension hook did (``nanocrab/hooks``): one event per hook that changed something.

Hooks are code the operator plugs in (``hooks.yaml``); the log keeps a digest of what they saw
and what they made of it, a short summary and a bounded diff, so a replay shows that a context,
a tool result or a run's end was touched, by which hook and how.
"""

from __future__ import annotations

from typing import Literal

from nanocrab.events.base import Event

HookPoint = Literal["before_model", "after_tool", "run_end"]


class HookApplied(Event, frozen=True, tag="hook.applied"):
    """``hook`` (its name in hooks.yaml) at ``point`` changed what it was given, annotated it,
    or failed (``error``: what it raised; the input was then used unchanged).

    ``before`` / ``after``: SHA-256 (first 16 hex digits) of the canonical JSON of the input and
    output (the model context, or the tool result's content); equal when only a note was added.
    ``summary``: what changed, in a line. ``diff``: a unified diff of the text, cut at 4,000
    characters. ``note``: the hook's annotation (``after_tool``, ``run_end``).
    ``turn``: the model turn (``before_model``); ``call_id`` / ``tool``: the call (``after_tool``).
    """

    hook: str
    point: HookPoint
    before: str = ""
    after: str = ""
    summary: str = ""
    diff: str = ""
    note: str = ""
    error: str | None = None
    turn: int | None = None
    call_id: str | None = None
    tool: str | None = None
