"""``nanocrab capabilities``: browse the registry, enable, disable, remove, and invoke a
capability in the WASM sandbox (``generate`` is in :mod:`nanocrab.cli.capgen`).

Reads go through the ``capabilities`` projection (brought up to date first); every change is an
event published as ``cli``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from nanocrab.cli.capgen import generate
from nanocrab.cli.common import (
    JsonOpt,
    capabilities_app,
    console,
    err,
    run_async,
    settings_or_exit,
    setup,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from nanocrab.bus import EventLog
    from nanocrab.cli.settings import Settings
    from nanocrab.events import Event
    from nanocrab.projections import CapabilityDetail, CapabilityRow

T = TypeVar("T")

capabilities_app.command()(generate)  # first in --help: where everything starts

NameArg = Annotated[str, typer.Argument(help="The capability's name (see `capabilities list`).")]


# --- reading the registry ---------------------------------------------------------------------


async def _fresh(log: EventLog, engine: AsyncEngine, settings: Settings) -> None:
    """Bring the registry up to date; with a ``nanocrab up`` running (which keeps it current
    itself), wait briefly for it to have applied everything on the capability subjects."""
    import asyncio

    from sqlalchemy import select

    from nanocrab.cli.host import RuntimeMarker
    from nanocrab.projections import CapabilitiesProjection, catch_up_projection, checkpoints

    if not RuntimeMarker(settings.home).alive():
        await catch_up_projection(log, engine, CapabilitiesProjection.name)
        return
    target = await log.last_seq(f"{log.subjects.root}.*.capability.>")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while loop.time() < deadline:
        async with engine.connect() as conn:
            position = await conn.scalar(
                select(checkpoints.c.stream_seq).where(
                    checkpoints.c.name == CapabilitiesProjection.name
                )
            )
        if (position or 0) >= target:
            return
        await asyncio.sleep(0.05)


def _read(settings: Settings, fetch: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    from nanocrab.cli.host import bus_session, engine_for

    async def main() -> T:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            engine = engine_for(settings.db_url)
            try:
                await _fresh(log, engine, settings)
                return await fetch(engine)
            finally:
                await engine.dispose()

    return run_async(main())


def _known(detail: CapabilityDetail | None, name: str) -> CapabilityDetail:
    if detail is None:
        err.print(
            f"[red]no capability {name!r}[/]; see `nanocrab capabilities list`, or create it with "
            '`nanocrab capabilities generate "what it should do"`'
        )
        raise typer.Exit(1)
    return detail


@capabilities_app.command("list")
def list_(
    all_: Annotated[bool, typer.Option("--all", help="Include removed capabilities.")] = False,
    json_: JsonOpt = False,
) -> None:
    """The registry: each capability's current version, status, safety level and call stats."""
    from nanocrab.cli.capabilities_render import registry_table, row_json
    from nanocrab.cli.render import print_json
    from nanocrab.projections import capability_stats, list_capabilities

    settings = settings_or_exit()

    async def fetch(engine: AsyncEngine) -> tuple[list[Any], dict[str, Any]]:
        rows = await list_capabilities(engine, include_removed=all_)
        return rows, {r.name: await capability_stats(engine, r.name) for r in rows}

    rows, stats = _read(settings, fetch)
    if json_:
        for r in rows:
            print_json(console, row_json(r, stats[r.name]))
        return
    if not rows:
        console.print(
            'no capabilities yet; create one with `nanocrab capabilities generate "count words '
            'in a text"`'
        )
        return
    console.print(registry_table(rows, stats))


@capabilities_app.command()
def show(name: NameArg, json_: JsonOpt = False) -> None:
    """One capability: metadata, versions, invocation stats (avg, p95, success rate), source."""
    from nanocrab.cli.capabilities_render import detail_json, detail_view
    from nanocrab.cli.render import print_json
    from nanocrab.projections import capability, capability_stats

    settings = settings_or_exit()

    async def fetch(engine: AsyncEngine) -> tuple[CapabilityDetail | None, Any]:
        return await capability(engine, name), await capability_stats(engine, name)

    detail, stats = _read(settings, fetch)
    detail = _known(detail, name)
    if json_:
        print_json(console, detail_json(detail, stats))
        return
    console.print(detail_view(detail, stats))


# --- changing the registry --------------------------------------------------------------------


def _change(name: str, make: Callable[[CapabilityDetail], Event | None]) -> CapabilityDetail:
    """Look ``name`` up, let ``make`` build the event (or exit), publish it as ``cli``."""
    from nanocrab.cli.host import bus_session, engine_for
    from nanocrab.projections import capability

    settings = settings_or_exit()

    async def main() -> CapabilityDetail:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            engine = engine_for(settings.db_url)
            try:
                await _fresh(log, engine, settings)
                detail = _known(await capability(engine, name), name)
            finally:
                await engine.dispose()
            event = make(detail)
            if event is not None:
                await log.append(event)
            return detail

    return run_async(main())


def _not_removed(detail: CapabilityDetail) -> None:
    if detail.row.removed:
        err.print(
            f"[red]{detail.row.name} was removed[/]; generate it again with "
            "`nanocrab capabilities generate ... --name " + detail.row.name + "`"
        )
        raise typer.Exit(1)


@capabilities_app.command()
def enable(name: NameArg) -> None:
    """Allow invocations of a disabled capability again."""
    from nanocrab.events import CapabilityEnabled

    def make(detail: CapabilityDetail) -> Event | None:
        _not_removed(detail)
        if detail.row.enabled:
            console.print(f"{name} is already enabled")
            return None
        return CapabilityEnabled(name=name, version=detail.row.version, source="cli")

    detail = _change(name, make)
    console.print(f"[green]enabled[/] {name} {detail.row.version}")


@capabilities_app.command()
def disable(
    name: NameArg,
    reason: Annotated[str, typer.Option(help="Why (recorded in the log).")] = "",
) -> None:
    """Refuse invocations of a capability until it is enabled again."""
    from nanocrab.events import CapabilityDisabled

    def make(detail: CapabilityDetail) -> Event | None:
        _not_removed(detail)
        if not detail.row.enabled:
            console.print(f"{name} is already disabled")
            return None
        return CapabilityDisabled(
            name=name, version=detail.row.version, reason=reason, source="cli"
        )

    detail = _change(name, make)
    console.print(
        f"[yellow]disabled[/] {name} {detail.row.version}; "
        f"`nanocrab capabilities enable {name}` to allow it again"
    )


@capabilities_app.command()
def remove(
    name: NameArg,
    reason: Annotated[str, typer.Option(help="Why (recorded in the log).")] = "",
) -> None:
    """Remove a capability from the registry (its history stays in the log)."""
    from nanocrab.events import CapabilityRemoved

    def make(detail: CapabilityDetail) -> Event | None:
        if detail.row.removed:
            console.print(f"{name} is already removed")
            return None
        return CapabilityRemoved(name=name, reason=reason, source="cli")

    _change(name, make)
    console.print(f"[red]removed[/] {name}")


# --- invoke -----------------------------------------------------------------------------------


@capabilities_app.command("invoke")
def invoke_(
    name: NameArg,
    args: Annotated[
        str,
        typer.Option("--args", help='The arguments as a JSON object, e.g. \'{"text": "a b"}\'.'),
    ] = "{}",
    json_: JsonOpt = False,
) -> None:
    """Run a capability in the WASM sandbox with JSON arguments and print the result.

    The arguments are checked against the capability's JSON Schema first (exit 2 if they do
    not fit); the run is recorded (time, memory, outcome) for its stats. Exits 1 if it
    failed or the capability is disabled, removed or unknown."""
    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as exc:
        err.print(f"[red]--args is not valid JSON[/] ({exc}); pass an object like '{{\"x\": 1}}'")
        raise typer.Exit(2) from exc
    if not isinstance(arguments, dict):
        err.print("[red]--args must be a JSON object[/] of the capability's parameters")
        raise typer.Exit(2)
    settings = settings_or_exit()
    setup(settings, "nanocrab-capabilities")
    code = run_async(_invoke(settings, name, arguments, json_))
    raise typer.Exit(code)


async def _invoke(settings: Settings, name: str, arguments: dict[str, Any], json_: bool) -> int:
    from nanocrab.cli.capabilities_render import describe_parameters, example_args, value_text
    from nanocrab.cli.host import bus_session, engine_for
    from nanocrab.cli.render import print_json
    from nanocrab.cli.wiring import sandbox_for
    from nanocrab.handlers.capgen import argument_errors, invoke
    from nanocrab.projections import capability

    async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
        engine = engine_for(settings.db_url)
        try:
            await _fresh(log, engine, settings)
            detail = _known(await capability(engine, name), name)
        finally:
            await engine.dispose()
        row = detail.row
        refused = refusal(row)
        if refused is not None:
            err.print(f"[red]{refused}[/]")
            return 1
        problems = argument_errors(row.parameters, arguments)
        if problems:
            err.print(f"[red]the arguments do not fit {name}'s parameters:[/]")
            for problem in problems:
                err.print(f"  - {problem}")
            err.print(f"parameters: {describe_parameters(row.parameters)}")
            err.print(f"e.g. --args '{example_args(row.parameters)}'")
            return 2
        call, event = await invoke(
            sandbox_for(settings), name=name, version=row.version, code=detail.code,
            entry=row.entry, arguments=arguments,
        )  # fmt: skip
        await log.append(event)
    if json_:
        print_json(
            console,
            {
                "name": name, "version": row.version, "ok": call.ok, "value": call.value,
                "error": call.error, "outcome": event.outcome,
                "duration_ms": event.duration_ms, "peak_memory_bytes": event.peak_memory_bytes,
            },
        )  # fmt: skip
        return 0 if call.ok else 1
    stats = f"{event.duration_ms:.0f} ms · {event.peak_memory_bytes / 2**20:.1f} MiB"
    if not call.ok:
        err.print(f"[bold red]{name} {row.version} failed ({event.outcome}):[/] {call.error}")
        err.print(f"[dim]{stats}[/]")
        return 1
    console.print(value_text(call.value), markup=False, highlight=False)
    console.print(f"[dim]{name} {row.version} · {stats}[/]")
    return 0


def refusal(row: CapabilityRow) -> str | None:
    """Why ``row``'s capability may not be invoked now, and what to do; ``None`` if it may."""
    if row.status == "enabled":
        return None
    reason = f" ({row.status_reason})" if row.status_reason else ""
    if row.status == "disabled":
        hint = f"`nanocrab capabilities enable {row.name}` allows it"
    else:
        hint = f'generate it again with `nanocrab capabilities generate "..." --name {row.name}`'
    return f"{row.name} is {row.status}{reason}: not invoked; {hint}"
