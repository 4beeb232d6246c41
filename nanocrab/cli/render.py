"""Rich rendering of events, timelines and status; JSON forms for machines."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nanocrab.bus import Stored
from nanocrab.bus.placement import Misplaced
from nanocrab.cli.shown import cell, visible
from nanocrab.events import Codec
from nanocrab.projections import summarize

_COLORS = {
    "task": "bold cyan", "run": "bold green", "reply": "bold magenta", "llm": "blue",
    "tool": "yellow", "grant": "green", "approval": "bold yellow", "bus": "bold red",
}  # fmt: skip
_codec = Codec(max_bytes=1 << 30)


def style_for(event_type: str) -> str:
    return _COLORS.get(event_type.split(".", 1)[0], "white")


def problem(s: Stored) -> str:
    """What a stored message that is not a believable event is: ``rejected`` for an event stored
    on another subject than its own (forged or mis-routed), ``undecodable`` otherwise."""
    return "rejected" if isinstance(s.error, Misplaced) else "undecodable"


def stored_json(s: Stored) -> dict[str, Any]:
    """The CloudEvents form of a stored event plus its stream position (for ``--json``)."""
    if s.event is None:
        return {
            "seq": s.seq,
            "subject": s.subject,
            "error": {
                "kind": (
                    "misplaced"
                    if isinstance(s.error, Misplaced)
                    else s.error.kind.value
                    if s.error
                    else "unknown"
                ),
                "message": str(s.error),
            },
        }
    wire = msgspec.to_builtins(_codec.to_wire(s.event, subject=s.subject))
    return {"seq": s.seq, **wire}


def event_line(s: Stored) -> Text:
    t = Text()
    t.append(f"{s.seq:>7} ", style="dim")
    if s.event is None:
        t.append(visible(f"{problem(s)} on {s.subject}: {s.error}"), style="bold red")
        return t
    e = s.event
    t.append(e.time.strftime("%H:%M:%S.%f")[:-3] + " ", style="dim")
    t.append(f"{e.type:<20} ", style=style_for(e.type))
    t.append(visible(f"{e.source:<10} "), style="cyan")
    if e.run_id:
        t.append(f"run={e.run_id[-8:]} ", style="dim")
    t.append(visible(summarize(e, 120)))
    return t


def timeline_table(run_id: str, events: list[Stored]) -> Table:
    table = Table(title=f"run {run_id}", title_justify="left", expand=False)
    table.add_column("seq", justify="right", style="dim", no_wrap=True, min_width=3)
    table.add_column("time", style="dim", no_wrap=True, min_width=12)
    table.add_column("+ms", justify="right", no_wrap=True, min_width=5)
    table.add_column("type", no_wrap=True, min_width=14)
    table.add_column("source", style="cyan", no_wrap=True, min_width=8)
    table.add_column("caused by", style="dim", no_wrap=True, min_width=4)
    table.add_column("details", overflow="ellipsis", no_wrap=True, max_width=70)
    previous: datetime | None = None
    ids = {s.event.id: s.seq for s in events if s.event}
    for s in events:
        if s.event is None:
            table.add_row(
                str(s.seq), "", "", Text(problem(s), "bold red"), "", "", cell(str(s.error))
            )
            continue
        e = s.event
        delta = "" if previous is None else f"{(e.time - previous).total_seconds() * 1000:.1f}"
        previous = e.time
        cause = f"#{ids[e.causation_id]}" if e.causation_id in ids else (e.causation_id or "")
        table.add_row(
            str(s.seq), e.time.strftime("%H:%M:%S.%f")[:-3], delta,
            Text(e.type, style_for(e.type)), cell(e.source), cell(cause), cell(summarize(e, 200)),
        )  # fmt: skip
    return table


def print_json(console: Console, value: Any) -> None:
    console.file.write(msgspec.json.encode(value).decode() + "\n")
    console.file.flush()
