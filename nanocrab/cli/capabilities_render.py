"""Rich rendering for ``nanocrab capabilities``: generation progress, the registry, one entry."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from nanocrab.events import (
    CapabilityGenerated,
    CapabilityRegistered,
    CapabilityTested,
    Event,
)
from nanocrab.projections import CapabilityDetail, CapabilityRow, CapabilityStats

_STATUS_STYLE = {"enabled": "bold green", "disabled": "yellow", "removed": "dim red"}
_SAFETY_STYLE = {"safe": "green", "restricted": "yellow", "dangerous": "bold red"}
_EXAMPLES = {"string": "…", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}


def short_hash(content_hash: str) -> str:
    return f"{content_hash[:12]}…" if content_hash else "-"


def example_args(parameters: dict[str, Any]) -> str:
    """A JSON object with a placeholder for each required parameter, for a usage hint."""
    props = parameters.get("properties") or {}
    example = {
        key: _EXAMPLES.get(str((props.get(key) or {}).get("type")), "…")
        for key in parameters.get("required") or []
    }
    return json.dumps(example, ensure_ascii=False)


def describe_parameters(parameters: dict[str, Any]) -> str:
    """``text (string, required), top (integer)``: a schema's properties in one line."""
    props = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    parts = []
    for key, prop in props.items():
        kind = str((prop or {}).get("type", "any"))
        parts.append(f"{key} ({kind}{', required' if key in required else ''})")
    return ", ".join(parts) or "none"


def value_text(value: Any) -> str:
    """A result as JSON: on one line when short, indented otherwise."""
    flat = json.dumps(value, ensure_ascii=False)
    return flat if len(flat) <= 100 else json.dumps(value, ensure_ascii=False, indent=2)


def progress_lines(event: Event) -> list[Text]:
    """What ``capabilities generate`` shows for one event of its request."""
    match event:
        case CapabilityGenerated(attempt=n, name=name, version=v, content_hash=h, model=model):
            what = f"{name or '(unnamed)'} {v or '(no version)'}"
            line = Text(f"attempt {n} · ", "bold").append(f"generated {what}")
            line.append(f" · sha256 {short_hash(h)}" + (f" · {model}" if model else ""), "dim")
            return [line]
        case CapabilityTested() as t:
            return _tested_lines(t)
        case CapabilityRegistered(name=name, version=v, content_hash=h, safety_level=level):
            line = Text("✔ registered ", "bold green").append(f"{name} {v}", "bold")
            line.append(f" · sha256 {short_hash(h)} · safety level ")
            line.append(level, _SAFETY_STYLE.get(level, "white"))
            return [line]
        case _:
            return []


def _tested_lines(t: CapabilityTested) -> list[Text]:
    head = Text(f"attempt {t.attempt} · ", "bold")
    if t.passed:
        head.append("passed", "bold green").append(f" · {t.report}")
    else:
        head.append("refused", "bold red").append(f" · {t.report}")
    lines = [head]
    for f in t.findings:
        where = f" (line {f.line})" if f.line else ""
        style = "red" if f.severity == "error" else "yellow"
        lines.append(Text("    ").append(f"[{f.rule}]", style).append(f" {f.message}{where}"))
    for test in t.tests:
        mark = Text("    ✓ ", "green") if test.passed else Text("    ✗ ", "red")
        lines.append(mark.append(test.name + (f": {test.error}" if test.error else "")))
    return lines


def registry_table(rows: list[CapabilityRow], stats: dict[str, CapabilityStats]) -> Table:
    table = Table(title="capabilities", title_justify="left")
    for col in ("name", "version", "status", "safety", "calls", "ok", "avg", "requires"):
        table.add_column(col, no_wrap=True)
    table.add_column("description · guidance", overflow="fold")
    for r in rows:
        s = stats.get(r.name) or CapabilityStats(0, None, None, None, None)
        table.add_row(
            r.name, r.version, Text(r.status, _STATUS_STYLE.get(r.status, "white")),
            Text(r.safety_level, _SAFETY_STYLE.get(r.safety_level, "white")),
            str(s.count), _rate(s.success_rate), _ms(s.avg_ms), ", ".join(r.requires) or "-",
            r.description + (f"\n[dim]{escape(r.user_guidance)}[/]" if r.user_guidance else ""),
        )  # fmt: skip
    return table


def detail_view(
    detail: CapabilityDetail, stats: CapabilityStats, *, required_by: Sequence[str] = ()
) -> Group:
    """``required_by``: the registered capabilities that require this one."""
    r = detail.row
    meta = Table.grid(padding=(0, 2))
    meta.add_column(style="bold")
    meta.add_column()
    status = Text(r.status, _STATUS_STYLE.get(r.status, "white"))
    if r.status_reason:
        status.append(f" ({r.status_reason})", "dim")
    rows: list[tuple[str, Text | str]] = [
        ("name", r.name),
        ("version", f"{r.version} (current of {len(detail.versions)})"),
        ("status", status),
        ("safety level", Text(r.safety_level, _SAFETY_STYLE.get(r.safety_level, "white"))),
        ("description", r.description),
        ("guidance", r.user_guidance or "-"),
        ("entry", r.entry),
        ("permissions", ", ".join(r.permissions) or "none"),
        ("requires", ", ".join(r.requires) or "none"),
        ("required by", ", ".join(required_by) or "none"),
        ("content hash", r.content_hash),
        ("registered", r.registered_at.astimezone().strftime("%Y-%m-%d %H:%M:%S")),
        ("parameters", describe_parameters(r.parameters)),
        ("invocations", _stats_line(stats)),
    ]
    for key, value in rows:
        meta.add_row(key, value)
    versions = Table(title="versions", title_justify="left")
    for col in ("version", "content hash", "safety", "attempts", "registered"):
        versions.add_column(col, no_wrap=True)
    for v in detail.versions:
        current = " (current)" if v.version == r.version else ""
        versions.add_row(
            v.version + current, short_hash(v.content_hash), v.safety_level, str(v.attempts),
            v.registered_at.astimezone().strftime("%Y-%m-%d %H:%M:%S"),
        )  # fmt: skip
    source = Syntax(detail.code, "python", line_numbers=True, word_wrap=True)
    return Group(meta, Text(""), versions, Text("source", "bold"), source)


def detail_json(detail: CapabilityDetail, stats: CapabilityStats) -> dict[str, Any]:
    r = detail.row
    return {
        "name": r.name, "version": r.version, "status": r.status,
        "status_reason": r.status_reason, "safety_level": r.safety_level,
        "description": r.description, "entry": r.entry, "parameters": r.parameters,
        "permissions": r.permissions, "content_hash": r.content_hash,
        "user_guidance": r.user_guidance, "requires": r.requires,
        "registered_at": r.registered_at.isoformat(),
        "versions": [
            {
                "version": v.version, "content_hash": v.content_hash,
                "safety_level": v.safety_level, "attempts": v.attempts,
                "registered_at": v.registered_at.isoformat(),
            }
            for v in detail.versions
        ],
        "stats": stats._asdict(),
        "code": detail.code,
    }  # fmt: skip


def row_json(r: CapabilityRow, s: CapabilityStats) -> dict[str, Any]:
    return {
        "name": r.name, "version": r.version, "status": r.status,
        "safety_level": r.safety_level, "description": r.description, "entry": r.entry,
        "parameters": r.parameters, "permissions": r.permissions,
        "content_hash": r.content_hash, "registered_at": r.registered_at.isoformat(),
        "user_guidance": r.user_guidance, "requires": r.requires,
        "stats": s._asdict(),
    }  # fmt: skip


def _stats_line(s: CapabilityStats) -> str:
    if s.count == 0:
        return "none yet"
    peak = f"{s.peak_memory_bytes / 2**20:.1f} MiB" if s.peak_memory_bytes else "-"
    return (
        f"{s.count} · success {_rate(s.success_rate)} · avg {_ms(s.avg_ms)} · "
        f"p95 {_ms(s.p95_ms)} · peak memory {peak}"
    )


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


def _ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"
