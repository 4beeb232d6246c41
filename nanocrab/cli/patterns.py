"""Checking an event type pattern (``tail --type``) against the catalogue before following it:
a pattern no event type matches would wait forever."""

from __future__ import annotations

import difflib
import fnmatch

from nanocrab.events import EVENT_TYPES


def type_pattern_error(pattern: str) -> str | None:
    """Why no event type matches ``pattern`` (``family``, ``family.name``, ``family.*``,
    ``*.name``, ``*``), with the closest known types; ``None`` when some type matches."""
    if pattern in ("*", ">"):
        return None
    full = pattern if "." in pattern else f"{pattern}.*"
    if full.count(".") == 1 and any(fnmatch.fnmatchcase(t, full) for t in EVENT_TYPES):
        return None
    families = sorted({t.split(".")[0] for t in EVENT_TYPES})
    close = difflib.get_close_matches(pattern, [*EVENT_TYPES, *families], n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
    return (
        f"no event type matches {pattern!r}{hint} Families: {', '.join(families)}; "
        "every type is listed in docs/events.md §4"
    )
