#!/usr/bin/env python3
"""Count error lines per minute in log files, and the most frequent error signatures.

Usage:
    python3 errors_by_minute.py [FILE ...] [--pattern REGEX] [--top N]

Reads standard input when no file (or "-") is given. Standard library only.

A line's minute comes from the first timestamp in it: ISO 8601 (2024-05-01T12:03:04Z,
2024-05-01 12:03:04,123) or syslog (May  1 12:03:04). Lines without one (stack trace
continuations) belong to the minute of the line before. Minutes are printed in the order they
first appear; for ISO timestamps, a gap of a minute or more with no lines at all is shown too,
because silence (a crash, a stalled process) is evidence.

An error line matches --pattern; the default matches ERROR, FATAL, CRITICAL, PANIC, SEVERE as
words, a Python traceback header, and JSON or logfmt levels (level=error, "level": "fatal").
The signature of an error line is the line without its timestamp, with numbers, hex ids and
UUIDs replaced by placeholders, so repeats of one error group together. A traceback header
right after an error line is part of that error and is not counted again.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

DEFAULT_PATTERN = (
    r"\b(?:ERROR|FATAL|CRITICAL|PANIC|SEVERE)\b"
    r"|Traceback \(most recent call last\)"
    r"|\"(?:level|severity|lvl)\"\s*:\s*\"(?i:error|fatal|critical|panic)\""
    r"|\b(?:level|severity|lvl)=\"?(?i:error|fatal|critical|panic)\b"
)
NO_TIMESTAMP = "(no timestamp)"
TRACEBACK = "Traceback (most recent call last)"
BAR_WIDTH = 40

ISO = re.compile(
    r"(\d{4}-\d{2}-\d{2})[T ](\d{2}):(\d{2})(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
)
SYSLOG = re.compile(
    r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(\d{1,2}) (\d{2}):(\d{2}):\d{2}\b"
)
_SIGNATURE_RULES = [
    (re.compile(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b", re.I), "<uuid>"),
    (re.compile(r"\b0x[0-9a-f]+\b|\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b", re.I), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]
MAX_SIGNATURE_CHARS = 160


@dataclass
class Minute:
    lines: int = 0
    errors: int = 0


@dataclass
class Tally:
    minutes: dict[str, Minute] = field(default_factory=dict)
    signatures: Counter[str] = field(default_factory=Counter)
    first_seen: dict[str, str] = field(default_factory=dict)
    total_lines: int = 0
    total_errors: int = 0


def minute_of(line: str) -> tuple[str, str] | None:
    """The minute key of the first timestamp in ``line`` and the matched text, or None."""
    if match := ISO.search(line):
        day, hour, minute = match.groups()
        return f"{day} {hour}:{minute}", match.group(0)
    if match := SYSLOG.search(line):
        month, day, hour, minute = match.groups()
        return f"{month} {int(day):02d} {hour}:{minute}", match.group(0)
    return None


def signature(line: str, stamp: str) -> str:
    text = line.replace(stamp, "", 1) if stamp else line
    for rule, placeholder in _SIGNATURE_RULES:
        text = rule.sub(placeholder, text)
    text = text.strip()
    return text if len(text) <= MAX_SIGNATURE_CHARS else text[: MAX_SIGNATURE_CHARS - 3] + "..."


def tally(lines: Iterable[str], pattern: re.Pattern[str]) -> Tally:
    result = Tally()
    current = NO_TIMESTAMP
    previous_was_error = False
    for raw in lines:
        line = raw.rstrip("\n")
        found = minute_of(line)
        stamp = ""
        if found is not None:
            current, stamp = found
        bucket = result.minutes.setdefault(current, Minute())
        bucket.lines += 1
        result.total_lines += 1
        is_error = pattern.search(line) is not None
        repeated = previous_was_error and line.startswith(TRACEBACK)
        previous_was_error = is_error
        if is_error and not repeated:
            bucket.errors += 1
            result.total_errors += 1
            sig = signature(line, stamp)
            result.signatures[sig] += 1
            result.first_seen.setdefault(sig, current)
    return result


def _iso_minute(key: str) -> datetime | None:
    try:
        return datetime.strptime(key, "%Y-%m-%d %H:%M")
    except ValueError:
        return None


def report(result: Tally, top: int) -> Iterator[str]:
    if not result.total_lines:
        yield "no lines read"
        return
    peak = max(bucket.errors for bucket in result.minutes.values())
    yield f"{'minute':<16}  {'errors':>6}  {'lines':>6}"
    previous: datetime | None = None
    for key, bucket in result.minutes.items():
        this = _iso_minute(key)
        if previous is not None and this is not None and this - previous > timedelta(minutes=1):
            silent = int((this - previous).total_seconds() // 60) - 1
            yield f"{'...':<16}  {'':>6}  {'':>6}  no lines for {silent} min"
        previous = this or previous
        bar = "#" * round(BAR_WIDTH * bucket.errors / peak) if peak else ""
        yield f"{key:<16}  {bucket.errors:>6}  {bucket.lines:>6}  {bar}".rstrip()
    yield f"total: {result.total_errors} error lines in {result.total_lines} lines"
    if top and result.signatures:
        yield ""
        yield f"top {top} error signatures (count, first minute, signature):"
        for sig, count in result.signatures.most_common(top):
            yield f"{count:>6}  {result.first_seen[sig]:<16}  {sig}"


def _read(paths: list[str]) -> Iterator[str]:
    for path in paths or ["-"]:
        if path == "-":
            yield from sys.stdin
        else:
            with open(path, encoding="utf-8", errors="replace") as handle:
                yield from handle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="log files; '-' or none for standard input")
    parser.add_argument("--pattern", default=DEFAULT_PATTERN, help="regex for an error line")
    parser.add_argument("--top", type=int, default=5, help="error signatures to list (0: none)")
    args = parser.parse_args(argv)
    try:
        pattern = re.compile(args.pattern)
    except re.error as exc:
        parser.error(f"--pattern is not a valid regex: {exc}")
    try:
        result = tally(_read(args.files), pattern)
    except OSError as exc:
        print(f"errors_by_minute: {exc}", file=sys.stderr)
        return 2
    for line in report(result, args.top):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
