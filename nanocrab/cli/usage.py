"""``nanocrab usage``: what the model calls cost, by run, session, agent, tenant, day or model
(the usage projection, brought up to date first); ``--exceeded`` lists the runs a budget
stopped (the audit)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from nanocrab.cli.common import JsonOpt, app, console, err, run_async, settings_or_exit

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from nanocrab.bus import EventLog
    from nanocrab.cli.settings import Settings

GROUPS = ("run", "session", "agent", "tenant", "day", "model")


async def _catch_up(log: EventLog, engine: AsyncEngine, settings: Settings, name: str) -> None:
    from nanocrab.cli.host import RuntimeMarker
    from nanocrab.projections import catch_up_projection

    if not RuntimeMarker(settings.home).alive():  # a running `nanocrab up` keeps it current
        await catch_up_projection(log, engine, name)


@app.command()
def usage(
    by: Annotated[str, typer.Option(help=f"Group by: {', '.join(GROUPS)}.")] = "run",
    since: Annotated[
        str | None,
        typer.Option(help="Calls at or after: 10m, 2h, 1d, or an ISO time (local if bare)."),
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's calls.")] = None,
    exceeded: Annotated[
        bool, typer.Option("--exceeded", help="List the runs a budget stopped instead.")
    ] = False,
    json_: JsonOpt = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many groups.")] = 1000,
) -> None:
    """Tokens, cost (USD, from the pricing table) and latency of model calls, costliest first."""
    from nanocrab.cli.audit import parse_since

    if by not in GROUPS:
        err.print(f"[red]unknown --by {by!r}[/]; use one of: {', '.join(GROUPS)}")
        raise typer.Exit(2)
    try:
        since_at = parse_since(since) if since else None
    except ValueError as exc:
        err.print(f"[red]bad --since {since!r}[/]: use 30s, 10m, 2h, 1d, 1w or an ISO time")
        raise typer.Exit(2) from exc
    settings = settings_or_exit()

    async def main() -> list[Any]:
        from nanocrab.cli.host import bus_session, engine_for
        from nanocrab.projections import AuditProjection, UsageProjection
        from nanocrab.projections.audit import budget_stops
        from nanocrab.projections.usage import usage_rows

        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            engine = engine_for(settings.db_url)
            try:
                if exceeded:
                    await _catch_up(log, engine, settings, AuditProjection.name)
                    stops = await budget_stops(engine, since=since_at)
                    return [s for s in stops if tenant is None or s.tenant == tenant][-limit:]
                await _catch_up(log, engine, settings, UsageProjection.name)
                return await usage_rows(engine, by, since=since_at, tenant=tenant, limit=limit)  # type: ignore[arg-type]
            finally:
                await engine.dispose()

    rows = run_async(main())
    if json_:
        for r in rows:
            plain = dataclasses.asdict(r)
            if not exceeded:
                plain["tokens"] = r.tokens
            console.file.write(json.dumps(plain, default=str) + "\n")
        console.file.flush()
        return
    console.print(_stops_table(rows) if exceeded else _usage_table(rows, by))


def _usage_table(rows: list[Any], by: str) -> Table:
    t = Table(title=f"usage by {by}", title_justify="left")
    t.add_column(by, no_wrap=True, overflow="ellipsis", max_width=30)
    for col in ("calls", "input", "output", "cache read", "cache write", "cost $", "mean ms"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            r.key, str(r.calls), str(r.input_tokens), str(r.output_tokens),
            str(r.cache_read_tokens), str(r.cache_write_tokens), f"{r.cost_usd:.4f}",
            f"{r.latency_ms:.0f}",
        )  # fmt: skip
    if rows:
        t.add_row(
            "total", str(sum(r.calls for r in rows)),
            *(str(sum(getattr(r, f) for r in rows)) for f in
              ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")),
            f"{sum(r.cost_usd for r in rows):.4f}", "", style="bold",
        )  # fmt: skip
    return t


def _stops_table(rows: list[Any]) -> Table:
    t = Table(title="runs stopped by a budget", title_justify="left")
    for col in ("time", "run", "scope", "key", "spent", "cap", "then"):
        t.add_column(col, no_wrap=True, overflow="ellipsis", max_width=30)
    for r in rows:
        usd = r.limit_kind == "usd"
        spent = f"${r.spent_usd:.4f}" if usd else f"{r.spent_tokens} tokens"
        cap = f"${r.max_usd}" if usd else f"{r.max_tokens} tokens"
        # failed (the cap ends runs), asked (a person is asked), raised by whom, refused how
        then = r.status
        if r.status == "raised":
            then += f" by {r.approver or '-'}"
        elif r.status == "refused":
            then += f" ({r.answer})"
        t.add_row(f"{r.time:%Y-%m-%d %H:%M:%S}", r.run_id or "", r.scope, r.key, spent, cap, then)
    return t
