"""``nanocrab audit`` (who was granted what, who approved, what ran) and ``nanocrab approvals``
(what waits for a human). Both read the audit projection after bringing it up to date."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.table import Table
from rich.text import Text

from nanocrab.cli.common import JsonOpt, app, console, err, run_async, settings_or_exit
from nanocrab.cli.shown import plain_row

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from nanocrab.bus import EventLog
    from nanocrab.cli.settings import Settings
    from nanocrab.projections import ApprovalRow, AuditRow, ViolationRow

T = TypeVar("T")

STATUSES: tuple[str, ...] = (
    "requested", "awaiting_approval", "granted", "denied", "running", "completed", "failed",
    "refused", "skipped", "revoked",
)  # fmt: skip
"""The audit's call statuses, for ``--status`` and its help: the same as
:data:`nanocrab.projections.audit.STATUSES` (tests/test_cli_lazy.py checks), spelled here so that
declaring the command does not import SQLAlchemy."""

_STATUS_STYLE = {
    "requested": "dim", "awaiting_approval": "bold yellow", "granted": "green",
    "denied": "red", "running": "cyan", "completed": "bold green", "failed": "bold red",
    "refused": "bold red", "skipped": "dim", "revoked": "magenta",
}  # fmt: skip
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``10m``, ``2h``, ``1d`` (before ``now``) or an ISO time (local time when it has no
    offset), as an aware UTC datetime. Raises ``ValueError`` otherwise."""
    if m := _AGO.match(text):
        delta = timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})
        return (now or datetime.now(UTC)) - delta
    value = datetime.fromisoformat(text.strip())
    return value.astimezone(UTC)


def _short(text: str | None, limit: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _args(arguments: dict[str, Any] | None, limit: int = 40) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in (arguments or {}).items())
    return _short(shown, limit)


def _key(public_key: str | None) -> str:
    return "" if not public_key else f"{public_key[:8]}…"


def _approver(approver: str | None) -> str:
    """``name [UKEY…]``: the name and the start of the signing key."""
    if not approver:
        return ""
    name, _, key = approver.partition(" [")
    return f"{name} [{_key(key.rstrip(']'))}]" if key else name


def _duration(ms: float | None, status: str) -> str:
    if ms is None:
        return "…" if status == "running" else ""
    return f"{ms:.0f}ms" if ms < 1000 else f"{ms / 1000:.1f}s"


def _local(t: datetime | None) -> str:
    return t.astimezone().strftime("%m-%d %H:%M:%S") if t else ""


def _in(delta_s: float) -> str:
    if delta_s <= 0:
        return "expired"
    minutes, seconds = divmod(int(delta_s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


async def _catch_up(log: EventLog, engine: AsyncEngine, settings: Settings) -> None:
    """Apply what the log has that the audit lacks; a running ``nanocrab up`` keeps it current
    itself (and created its tables), so it is left to do so."""
    from nanocrab.cli.host import RuntimeMarker
    from nanocrab.projections import AuditProjection, catch_up_projection

    if RuntimeMarker(settings.home).alive():
        return
    await catch_up_projection(log, engine, AuditProjection.name)


def print_run_audit(settings: Settings, run_id: str) -> None:
    """One run's calls in a narrow table — tool, tier, approval, status, time — for the end of
    the demo, whose timeline has already shown the arguments."""
    from nanocrab.projections import audit_rows

    rows = _read(settings, lambda engine: audit_rows(engine, run_id=run_id))
    t = Table(title=f"audit of run {run_id}", title_justify="left")
    for col in ("tool", "tier", "approval", "status", "duration"):
        t.add_column(col, no_wrap=True, overflow="ellipsis", max_width=30)
    for r in rows:
        approval = r.approval_result or ""
        if r.approver:
            approval += f" by {_approver(r.approver)}"
        plain_row(
            t, r.tool or "?", r.tier or "", approval,
            Text(r.status, _STATUS_STYLE.get(r.status, "white")),
            _duration(r.duration_ms, r.status),
        )  # fmt: skip
    console.print(t)


def _read(settings: Settings, fetch: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    from nanocrab.cli.host import bus_session, engine_for

    async def main() -> T:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            engine = engine_for(settings.db_url)
            try:
                await _catch_up(log, engine, settings)
                return await fetch(engine)
            finally:
                await engine.dispose()

    return run_async(main())


def _plain(row: Any, **extra: Any) -> dict[str, Any]:
    return {**dataclasses.asdict(row), **extra}


def _emit_json(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        console.file.write(json.dumps(row, default=_iso, ensure_ascii=False) + "\n")
    console.file.flush()


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _emit_csv(columns: list[str], rows: list[dict[str, Any]]) -> None:
    def cell(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, datetime):
            return v.isoformat()
        if isinstance(v, dict | list):
            return json.dumps(v, ensure_ascii=False)
        return str(v)

    writer = csv.writer(console.file, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([cell(row[c]) for c in columns])
    console.file.flush()


def calls_table(rows: list[AuditRow], title: str, *, with_run: bool = True) -> Table:
    """One line per call; long cells are cut with an ellipsis rather than wrapped, so the table
    stays readable in an 80-column terminal."""
    t = Table(title=title, title_justify="left")
    cut: dict[str, Any] = {"no_wrap": True, "overflow": "ellipsis"}
    fixed: dict[str, Any] = {"no_wrap": True}
    columns: list[tuple[str, dict[str, Any]]] = [
        ("time", {**fixed, "style": "dim", "min_width": 14}),
        *([("run", {**fixed, "style": "dim", "min_width": 8})] if with_run else []),
        ("tool", {**fixed, "min_width": 5}), ("args", {**cut, "max_width": 36}),
        ("tier", {**fixed, "min_width": 7}), ("approval", {**cut, "max_width": 26}),
        ("status", {**fixed, "min_width": 9}),
        ("duration", {**fixed, "justify": "right", "min_width": 6}),
        ("error", {**cut, "max_width": 40}),
    ]  # fmt: skip
    for col, kw in columns:
        t.add_column(col, **kw)
    for r in rows:
        approval = r.approval_result or ""
        if r.approver:
            approval += f" by {_approver(r.approver)}"
        cells: list[str | Text] = [
            _local(r.requested_at), *([(r.run_id or "")[-8:]] if with_run else []),
            r.tool or "?", _args(r.arguments), r.tier or "", approval,
            Text(r.status, _STATUS_STYLE.get(r.status, "white")),
            _duration(r.duration_ms, r.status), _short(r.error, 60),
        ]  # fmt: skip
        plain_row(t, *cells)
    return t


def _violations_table(rows: list[ViolationRow]) -> Table:
    t = Table(title=f"security violations ({len(rows)})", title_justify="left")
    for col in ("time", "run", "refused", "event", "signer", "by", "reason"):
        t.add_column(col)
    for v in rows:
        plain_row(
            t, _local(v.time), (v.run_id or "")[-8:], Text(v.rejected_type, "bold red"),
            _key(v.rejected_id), _key(v.signer), v.source, _short(v.reason, 80),
        )  # fmt: skip
    return t


async def _find_call(
    engine: AsyncEngine, given: str, **filters: Any
) -> tuple[list[AuditRow], str | None]:
    """The calls whose id is ``given``, else those of the ``RUN:CALL`` it spells (with ``RUN``,
    as given, still to match); every run's, for the caller to tell apart."""
    from nanocrab.projections import audit_rows

    rows = await audit_rows(engine, call_id=given, **filters)
    if rows or ":" not in given:
        return rows, None
    run, call_id = given.split(":", 1)  # a run id (a ULID) holds no colon; a call id might
    return await audit_rows(engine, call_id=call_id, **filters), run


def _one_call(given: str, rows: list[AuditRow], run: str | None) -> list[AuditRow]:
    """The call ``given`` names among ``rows`` (the calls with its id): one run's. Exits 1
    saying why when it names none, or when its id was used in several runs (listing them)."""
    from nanocrab.cli.ids import IdError, resolve_id

    if run is not None and rows:
        try:
            chosen = resolve_id(run, [r.run_id or "" for r in rows], what="run")
        except IdError as exc:
            err.print(f"[red]{exc}[/] (among the runs with call {rows[0].call_id})")
            raise typer.Exit(1) from exc
        rows = [r for r in rows if (r.run_id or "") == chosen]
    if not rows:
        err.print(f"[red]no call {given!r}[/] matches; list them with `nanocrab audit`")
        raise typer.Exit(1)
    runs = list(dict.fromkeys(r.run_id or "" for r in rows))
    if len(runs) > 1:
        err.print(
            f"[red]call id {rows[0].call_id!r} was used in {len(runs)} runs[/] "
            "(call ids come from the model provider):"
        )
        for run_id in runs:
            err.print(f"  {run_id}", soft_wrap=True)
        err.print(f"name one with --call RUN:{rows[0].call_id} or --run RUN", soft_wrap=True)
        raise typer.Exit(1)
    return rows


def _nothing(what: str, filters: dict[str, str | None], machine: bool) -> None:
    applied = ", ".join(f"{k}={v}" for k, v in filters.items() if v)
    line = f"nothing matched ({applied})" if applied else f"no {what} recorded yet"
    (err if machine else console).print(f"[dim]{line}[/]")


@app.command()
def audit(
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run.")] = None,
    call: Annotated[
        str | None,
        typer.Option(
            "--call",
            help="Only this call: its id, or RUN:CALL where the model provider used the id in "
            "several runs (RUN: the run id, or its unique start or end).",
        ),
    ] = None,
    tool: Annotated[str | None, typer.Option(help="Only this tool.")] = None,
    status: Annotated[
        str | None, typer.Option(help=f"Only this status: {', '.join(STATUSES)}.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Requested at or after: 10m, 2h, 1d, or an ISO time (local if bare)."),
    ] = None,
    show_violations: Annotated[
        bool,
        typer.Option("--violations", help="List refused forgeries (security.rejected) instead."),
    ] = False,
    json_: JsonOpt = False,
    csv_: Annotated[bool, typer.Option("--csv", help="CSV with a header row.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many (the newest).")] = 1000,
) -> None:
    """Every tool call: arguments, capabilities asked and granted, tier, who approved, status,
    timings and errors."""
    from nanocrab.projections import AuditRow, ViolationRow, audit_rows
    from nanocrab.projections import violations as list_violations

    if json_ and csv_:
        err.print("[red]use --json or --csv, not both[/]")
        raise typer.Exit(2)
    if status is not None and status not in STATUSES:
        err.print(f"[red]unknown --status {status!r}[/]; use one of: {', '.join(STATUSES)}")
        raise typer.Exit(2)
    if show_violations and (tool or status or call):
        err.print(
            "[red]--tool, --status and --call do not apply to --violations[/] (use --run, --since)"
        )
        raise typer.Exit(2)
    try:
        since_at = parse_since(since) if since else None
    except ValueError as exc:
        err.print(
            f"[red]bad --since {since!r}[/]: use 30s, 10m, 2h, 1d, 1w or an ISO time such as "
            "2025-03-01T12:00 or 2025-03-01T12:00:00+00:00"
        )
        raise typer.Exit(2) from exc
    settings = settings_or_exit()
    filters = {"run": run_id, "tool": tool, "status": status, "since": since}
    machine = json_ or csv_

    if show_violations:
        found = _read(settings, lambda e: list_violations(e, run_id=run_id, since=since_at))
        found = found[-limit:]
        plain = [_plain(v) for v in found]
        columns = [f.name for f in dataclasses.fields(ViolationRow)]
        _output(found, plain, columns, json_, csv_, lambda: _violations_table(found))
        if not found:
            _nothing("violations", filters, machine)
        return

    query: dict[str, Any] = {
        "run_id": run_id, "tool": tool, "status": status, "since": since_at, "limit": limit,
    }  # fmt: skip
    if call is not None:
        found_calls, run = _read(settings, lambda e: _find_call(e, call, **query))
        rows = _one_call(call, found_calls, run)
    else:
        rows = _read(settings, lambda e: audit_rows(e, **query))
    plain = [_plain(r, duration_ms=r.duration_ms) for r in rows]
    columns = [*(f.name for f in dataclasses.fields(AuditRow)), "duration_ms"]
    title = f"audit: {len(rows)} tool call{'s' if len(rows) != 1 else ''}"
    _output(rows, plain, columns, json_, csv_, lambda: calls_table(rows, title))
    if not rows:
        _nothing("tool calls", filters, machine)


def _output(
    found: list[Any],
    plain: list[dict[str, Any]],
    columns: list[str],
    json_: bool,
    csv_: bool,
    table: Callable[[], Table],
) -> None:
    if json_:
        _emit_json(plain)
    elif csv_:
        _emit_csv(columns, plain)
    elif found:
        console.print(table())


@app.command()
def approvals(json_: JsonOpt = False) -> None:
    """Approvals waiting for a human: the call, its tier, why it needs one, when it expires."""
    from nanocrab.projections import pending_approvals

    settings = settings_or_exit()
    now = datetime.now(UTC)
    pending: list[ApprovalRow] = _read(settings, lambda e: pending_approvals(e, now=now))
    if json_:
        _emit_json([
            _plain(a, expires_in_s=(a.expires_at - now).total_seconds() if a.expires_at else None)
            for a in pending
        ])  # fmt: skip
        return
    if not pending:
        console.print("[green]no approvals waiting[/]")
        return
    t = Table(title=f"approvals waiting ({len(pending)})", title_justify="left")
    for col in ("id", "run", "tool", "arguments", "tier", "reason", "expires in", "options"):
        t.add_column(col, no_wrap=col in ("id", "expires in"))
    for a in pending:
        left = (a.expires_at - now).total_seconds() if a.expires_at else 0.0
        plain_row(  # the arguments in full, wrapped: what approving would run
            t, a.approval_id, (a.run_id or "")[-8:], a.tool or "?", _args(a.arguments, 4000),
            Text(a.tier or "", "bold red" if a.tier == "unsafe" else "yellow"),
            _short(a.reason, 50), _in(left), ", ".join(a.options),
        )  # fmt: skip
    console.print(t)
    console.print(
        "[dim]approve with `nanocrab approve ID [--session]`, "
        "refuse with `nanocrab deny ID --reason ...`[/]"
    )
