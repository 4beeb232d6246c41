"""Event content on a person's terminal: shown, never obeyed.

Whatever a model, a tool's output, a task or a tenant wrote reaches ``replay``, ``tail``,
``audit``, ``approvals`` and ``run``'s live lines and approval prompt. Two ways it could act
instead of being shown: Rich markup (``[bold]``, ``[/]``, ``[link=…]``: a list display such
as ``[os.system('…')]`` is an unknown tag Rich silently drops, which hid the dangerous part of
a call from the person approving it, and a stray ``[/]`` crashed the command), and terminal
control sequences (ESC, CSI, OSC, C1: a reply that erased the timeline above it, links whose
text lied, clipboard writes). Every such value goes to the console through :func:`visible`
inside a :class:`~rich.text.Text` (never parsed as markup): control characters become visible
escapes (``\\x1b``). An adversarial pass (8) did all of the above.
"""

from __future__ import annotations

import re

from rich.table import Table
from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab written as an escape."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)  # fmt: skip


def cell(text: str | None, style: str = "") -> Text:
    """A table cell or a line part holding ``text`` as it is: no markup, no control codes."""
    return Text(visible(text or ""), style=style)


def cleaned(line: Text) -> Text:
    """``line`` itself when its text holds no control character; else the same text made
    visible (its styles dropped: only a line carrying control codes loses them)."""
    if not _CONTROL.search(line.plain):
        return line
    return Text(visible(line.plain), style=line.style, end=line.end)


def plain_row(table: Table, *values: str | Text) -> None:
    """``table.add_row`` with every ``str`` value shown as it is (:func:`cell`)."""
    table.add_row(*(cell(v) if isinstance(v, str) else v for v in values))
