"""Event content reaches a person's terminal as text: never as Rich markup, never as terminal
control sequences (nanocrab/cli/shown.py). An adversarial pass (8) hid the dangerous part of a
call from the person approving it (``[os.system(…)]`` is a markup tag Rich drops), crashed
``approvals``/``audit``/``replay`` with a stray ``[/]``, and erased the ``replay`` timeline and
forged lines in ``tail`` with escape sequences in a model's reply or a task."""

from __future__ import annotations

import io
from datetime import timedelta

from rich.console import Console
from rich.table import Table

from nanocrab.bus import Stored
from nanocrab.cli.answers import describe
from nanocrab.cli.live import line_for
from nanocrab.cli.render import event_line, timeline_table
from nanocrab.cli.shown import plain_row, visible
from nanocrab.events import ApprovalRequested, ReplySent, RunFailed, TaskSubmitted, utcnow

HIDDEN = "python3 -c \"import os;[os.system('echo owned > PWNED')];print('ok')\""
ERASE = "\x1b[99A\x1b[J\x1b]8;;https://evil.example\x1b\\docs\x1b]8;;\x1b\\ \x9b2J done"


def shown(*renderables: object) -> str:
    """What a terminal would receive: a colour terminal, so styles are escape codes too."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="standard", width=400)
    for r in renderables:
        console.print(r)
    return out.getvalue()


def stored(event: object, seq: int = 1) -> Stored:
    return Stored(seq=seq, subject="s", stored_ns=0, event=event)  # type: ignore[arg-type]


def test_visible_escapes_control_characters_and_keeps_lines() -> None:
    assert visible("a\tb\nc") == "a\tb\nc"
    assert visible("\x1b[2J\x07\x9b\x7f\u2028") == "\\x1b[2J\\x07\\x9b\\x7f\\u2028"


def test_the_approval_prompt_shows_the_whole_call() -> None:
    request = ApprovalRequested(
        approval_id="A1", call_id="c1", tool="exec", arguments={"command": HIDDEN},
        tier="unsafe", reason="shell [bold]segment[/] " + ERASE,
        expires_at=utcnow() + timedelta(minutes=5),
    )  # fmt: skip
    out = shown(describe(request))
    assert "[os.system(" in out and "echo owned > PWNED" in out
    assert "[bold]segment[/]" in out
    assert "\x1b[99A" not in out and "\x9b" not in out and "\\x1b[99A" in out


def test_replay_tail_and_run_lines_show_escapes_and_markup_as_text() -> None:
    events = [
        stored(TaskSubmitted(text="summarise [/] please " + ERASE, run_id="R1"), 1),
        stored(ReplySent(text=ERASE, run_id="R1"), 2),
        stored(RunFailed(kind="tool", reason="[red]x[/] " + ERASE, run_id="R1"), 3),
    ]
    rendered = [timeline_table("R1", events), *(event_line(s) for s in events),
                *(line_for(s) for s in events)]  # fmt: skip
    out = shown(*rendered)
    assert "\x1b[99A" not in out and "\x1b]8;;" not in out and "\x9b" not in out
    assert out.count("\\x1b[99A") >= 3
    assert "summarise [/] please" in out


def test_a_table_row_with_a_stray_closing_tag_renders() -> None:
    table = Table("tool", "arguments")
    plain_row(table, "write", "content='see [/]' " + ERASE)
    out = shown(table)
    assert "see [/]" in out and "\x1b[99A" not in out
