"""Text handling shared by tools: telling text from binary, and keeping the tail of long output."""

from __future__ import annotations

from dataclasses import dataclass

BOM = "\ufeff"
_SNIFF_BYTES = 8192


def looks_binary(data: bytes) -> bool:
    """Whether ``data`` is binary rather than text: a NUL byte in its first 8 KiB."""
    return b"\x00" in data[:_SNIFF_BYTES]


def count_lines(text: str) -> int:
    """Lines in ``text``; a final newline ends the last line rather than starting another."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


@dataclass(frozen=True, slots=True)
class Tail:
    """The end of a text: ``text`` holds its last ``shown_lines`` of ``total_lines`` lines."""

    text: str
    total_lines: int
    shown_lines: int
    truncated: bool


def truncate_tail(text: str, *, max_lines: int, max_bytes: int) -> Tail:
    """Keep the last lines of ``text`` that fit both ``max_lines`` and ``max_bytes`` (UTF-8).

    Whole lines are kept; when even the last line alone is over ``max_bytes``, its final bytes
    are kept (cut on a character boundary).
    """
    total = count_lines(text)
    if total <= max_lines and len(text.encode()) <= max_bytes:
        return Tail(text=text, total_lines=total, shown_lines=total, truncated=False)
    lines = text.removesuffix("\n").split("\n")
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        cost = len(line.encode()) + 1
        if len(kept) >= max_lines or size + cost > max_bytes:
            break
        kept.append(line)
        size += cost
    if not kept:
        last = lines[-1].encode()[-max(max_bytes - 1, 0) :]
        kept = [last.decode(errors="ignore")]
    kept.reverse()
    return Tail(
        text="\n".join(kept) + "\n", total_lines=total, shown_lines=len(kept), truncated=True
    )
