"""Short ids: any unique prefix or suffix of a run or approval id names it.

``tail``, ``audit`` and ``approvals`` show the last 8 characters of a run id (ULIDs of one
period share their first characters); every command taking a run or approval id accepts that,
the whole id, or any other unique prefix or suffix, case-insensitively.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import typer

from nanocrab.bus import EventLog
from nanocrab.cli.common import err

MIN_SHORT = 4
"""Shortest prefix or suffix accepted: fewer characters would name a run by accident."""


class IdError(ValueError):
    """``given`` names no id (``unknown``), several (``ambiguous``, listed in ``candidates``) or
    is too short to try (``short``); the message says which and what to do."""

    def __init__(
        self,
        message: str,
        *,
        kind: Literal["unknown", "ambiguous", "short"],
        given: str,
        candidates: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.given = given
        self.candidates = candidates


def resolve_id(given: str, known: Iterable[str], *, what: str = "run") -> str:
    """The id in ``known`` equal to ``given``, else the only one that starts or ends with it.

    Matching ignores case. Raises :class:`IdError` when none matches, when several do (listing
    up to five), or when ``given`` is shorter than :data:`MIN_SHORT` and not a whole id.
    """
    ids = list(dict.fromkeys(known))
    if given in ids:
        return given
    needle = given.strip().upper()
    exact = [i for i in ids if i.upper() == needle]
    if len(exact) == 1:
        return exact[0]
    if len(needle) < MIN_SHORT:
        raise IdError(
            f"{what} id {given!r} is too short: give at least {MIN_SHORT} characters of its "
            "start or end",
            kind="short",
            given=given,
        )
    found = tuple(i for i in ids if i.upper().startswith(needle) or i.upper().endswith(needle))
    if not found:
        raise IdError(
            f"no {what} {given!r}: no {what} id equals, starts or ends with it",
            kind="unknown",
            given=given,
        )
    if len(found) > 1:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise IdError(
            f"{what} id {given!r} is ambiguous: it matches {shown}; give more characters",
            kind="ambiguous",
            given=given,
            candidates=found,
        )
    return found[0]


async def run_ids(log: EventLog) -> list[str]:
    """Every run id with a ``task.submitted`` on the log, as its subject token (the server
    lists the subjects; no event is read)."""
    root = log.cfg.root
    info = await log.js.stream_info(
        log.cfg.log_stream, subjects_filter=f"{root}.*.run.*.task.submitted"
    )
    subjects = info.state.subjects or {}
    return sorted({subject.split(".")[3] for subject in subjects})


async def resolve_run(log: EventLog, given: str, *, missing_ok: bool = False) -> str:
    """The run ``given`` names (see :func:`resolve_id`); exits 1 with the reason if none or
    several do. A whole id with events on the log is taken as is; so is one that names no run
    when ``missing_ok`` (``tail --run`` may wait for a run that has not started yet)."""
    if await log.last_seq(log.subjects.run(given)):
        return given
    try:
        return resolve_id(given, await run_ids(log), what="run")
    except IdError as exc:
        if missing_ok and exc.kind == "unknown":
            return given
        why = f" (no events for run {given!r})" if exc.kind == "unknown" else ""
        err.print(f"[red]{exc}[/]{why}; list runs with `nanocrab tail --all --type run.started`")
        raise typer.Exit(1) from exc
