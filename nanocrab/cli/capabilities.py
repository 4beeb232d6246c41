"""``nanocrab capabilities``: browse the registry, enable, disable, remove, and invoke a
capability in the WASM sandbox (``generate`` is in :mod:`nanocrab.cli.capgen`).

Reads go through the ``capabilities`` projection (brought up to date first); every change is an
event published as ``cli``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

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
    from nanocrab.capabilities.config import CapabilityConfig
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
    """One capability: metadata (guidance, what it requires and what requires it), versions,
    invocation stats (avg, p95, success rate), source."""
    from nanocrab.cli.capabilities_render import detail_json, detail_view
    from nanocrab.cli.render import print_json
    from nanocrab.projections import capability, capability_stats, list_capabilities

    settings = settings_or_exit()

    async def fetch(engine: AsyncEngine) -> tuple[CapabilityDetail | None, Any, list[str]]:
        rows = await list_capabilities(engine)
        required_by = sorted(r.name for r in rows if name in r.requires)
        return await capability(engine, name), await capability_stats(engine, name), required_by

    detail, stats, required_by = _read(settings, fetch)
    detail = _known(detail, name)
    if json_:
        print_json(console, {**detail_json(detail, stats), "required_by": required_by})
        return
    console.print(detail_view(detail, stats, required_by=required_by))


# --- changing the registry --------------------------------------------------------------------


Rows = dict[str, "CapabilityRow"]


def _change(name: str, make: Callable[[CapabilityDetail, Rows], list[Event]]) -> CapabilityDetail:
    """Look ``name`` up, let ``make`` build the events from it and every registry row by name
    (removed ones too) or exit, publish them as ``cli`` in order."""
    from nanocrab.cli.host import bus_session, engine_for
    from nanocrab.projections import capability, list_capabilities

    settings = settings_or_exit()

    async def main() -> CapabilityDetail:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            engine = engine_for(settings.db_url)
            try:
                await _fresh(log, engine, settings)
                detail = _known(await capability(engine, name), name)
                rows = await list_capabilities(engine, include_removed=True)
            finally:
                await engine.dispose()
            for event in make(detail, {r.name: r for r in rows}):
                await log.append(event)
            return detail

    return run_async(main())


def config_or_exit() -> CapabilityConfig:
    """``capabilities.yaml``'s settings (``NANOCRAB_CAPABILITIES``, else in the config directory
    ``NANOCRAB_CONFIG_DIR`` or the data directory, as :func:`nanocrab.cli.wiring.config_dir`);
    exit 2 with its ``file:line`` problem if it is bad."""
    import os
    from pathlib import Path

    from nanocrab.capabilities.config import (
        CapabilityConfigError,
        capabilities_file,
        load_capability_config,
    )

    settings = settings_or_exit()
    directory = Path(os.environ.get("NANOCRAB_CONFIG_DIR") or settings.home)
    try:
        return load_capability_config(capabilities_file(directory, os.environ))
    except CapabilityConfigError as exc:
        err.print(f"[bold red]configuration error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from exc


def _not_removed(detail: CapabilityDetail) -> None:
    if detail.row.removed:
        err.print(
            f"[red]{detail.row.name} was removed[/]; generate it again with "
            "`nanocrab capabilities generate ... --name " + detail.row.name + "`"
        )
        raise typer.Exit(1)


def _refuse(message: str) -> NoReturn:
    err.print(f"[red]{message}[/]", highlight=False)
    raise typer.Exit(1)


class EnableRefused(Exception):
    """Enabling is refused; the message says why and what to do."""


def enable_events(
    row: CapabilityRow, rows: Rows, config: CapabilityConfig, *, with_deps: bool = False
) -> list[Event]:
    """The ``capability.enabled`` events (as ``cli``) enabling ``row``'s capability: its
    disabled dependencies first when ``with_deps`` (or ``enable_dependencies``); otherwise
    none may be disabled. ``rows``: the whole registry by name, removed rows included. Raises
    :class:`EnableRefused` saying why and what to do."""
    from nanocrab.capabilities.deps import to_enable
    from nanocrab.events import CapabilityEnabled
    from nanocrab.projections.capabilities import dependency_nodes

    registry = dependency_nodes(list(rows.values()))
    if refused := config.why_refused(row.permissions):
        raise EnableRefused(f"{row.name} is not enabled: {refused}")
    disabled, fatal = to_enable(registry, row.name)
    if fatal:
        raise EnableRefused(
            f"{row.name} is not enabled: it requires {'; '.join(fatal)}; generate what is "
            "missing or drop it from the module's requires"
        )
    for dep in disabled:
        if why := config.why_refused(rows[dep].permissions):
            raise EnableRefused(f"{row.name} is not enabled: its dependency {dep}: {why}")
    if disabled and not (with_deps or config.enable_dependencies):
        names = ", ".join(disabled)
        raise EnableRefused(
            f"{row.name} is not enabled: it requires {names}, not enabled; enable "
            f"{'them' if len(disabled) > 1 else 'it'} first (`nanocrab capabilities enable "
            f"{disabled[0]}`), pass --with-deps, or set capability_config.enable_dependencies"
        )
    events: list[Event] = [
        CapabilityEnabled(
            name=dep, version=rows[dep].version, requires=list(rows[dep].requires),
            required_by=row.name, source="cli",
        )
        for dep in disabled
    ]  # fmt: skip
    events.append(
        CapabilityEnabled(
            name=row.name, version=row.version, requires=list(row.requires), source="cli"
        )
    )
    return events


@capabilities_app.command()
def enable(
    name: NameArg,
    with_deps: Annotated[
        bool,
        typer.Option(
            "--with-deps", help="Also enable the capabilities it requires that are disabled."
        ),
    ] = False,
) -> None:
    """Allow invocations of a disabled capability again.

    Everything it requires must be enabled (exit 1 otherwise), unless --with-deps or
    capability_config.enable_dependencies enables those too; a capability declaring a
    permission capability_config does not permit is refused."""
    config = config_or_exit()

    def make(detail: CapabilityDetail, rows: Rows) -> list[Event]:
        _not_removed(detail)
        if detail.row.enabled:
            console.print(f"{name} is already enabled")
            return []
        try:
            return enable_events(detail.row, rows, config, with_deps=with_deps)
        except EnableRefused as exc:
            _refuse(str(exc))

    detail = _change(name, make)
    console.print(f"[green]enabled[/] {name} {detail.row.version}")


def _dependents_or_exit(name: str, rows: Rows, *, force: bool, what: str) -> list[str]:
    """The enabled capabilities depending on ``name``; exit 1 when there are some and not
    ``force``."""
    from nanocrab.capabilities.deps import dependents
    from nanocrab.projections.capabilities import dependency_nodes

    found = dependents(dependency_nodes(list(rows.values())), name)
    if found and not force:
        _refuse(
            f"{name} is not {what}: {', '.join(found)} "
            f"{'require' if len(found) > 1 else 'requires'} it; {what.rstrip('d')} "
            f"{'them' if len(found) > 1 else 'it'} first, or pass --force (they then stay "
            "enabled but cannot be invoked)"
        )
    return found


ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Even if enabled capabilities require it (they cannot run until it is back).",
    ),
]


@capabilities_app.command()
def disable(
    name: NameArg,
    reason: Annotated[str, typer.Option(help="Why (recorded in the log).")] = "",
    force: ForceOpt = False,
) -> None:
    """Refuse invocations of a capability until it is enabled again (refused while enabled
    capabilities require it, unless --force)."""
    from nanocrab.events import CapabilityDisabled

    def make(detail: CapabilityDetail, rows: Rows) -> list[Event]:
        _not_removed(detail)
        if not detail.row.enabled:
            console.print(f"{name} is already disabled")
            return []
        found = _dependents_or_exit(name, rows, force=force, what="disabled")
        return [
            CapabilityDisabled(
                name=name, version=detail.row.version, reason=reason, source="cli",
                forced=bool(found), dependents=found,
            )
        ]  # fmt: skip

    detail = _change(name, make)
    console.print(
        f"[yellow]disabled[/] {name} {detail.row.version}; "
        f"`nanocrab capabilities enable {name}` to allow it again"
    )


@capabilities_app.command()
def remove(
    name: NameArg,
    reason: Annotated[str, typer.Option(help="Why (recorded in the log).")] = "",
    force: ForceOpt = False,
) -> None:
    """Remove a capability from the registry (its history stays in the log); refused while
    enabled capabilities require it, unless --force."""
    from nanocrab.events import CapabilityRemoved

    def make(detail: CapabilityDetail, rows: Rows) -> list[Event]:
        if detail.row.removed:
            console.print(f"{name} is already removed")
            return []
        found = _dependents_or_exit(name, rows, force=force, what="removed")
        return [
            CapabilityRemoved(
                name=name, reason=reason, source="cli", forced=bool(found), dependents=found
            )
        ]

    _change(name, make)
    console.print(f"[red]removed[/] {name}")


# --- settings ---------------------------------------------------------------------------------


@capabilities_app.command("settings")
def settings_(json_: JsonOpt = False) -> None:
    """Check capabilities.yaml and print the capability_config in effect (defaults where the
    file is silent, or with no file): exit 2 with the file:line of a problem."""
    import os
    from pathlib import Path

    import yaml

    from nanocrab.capabilities.config import capabilities_file
    from nanocrab.cli.render import print_json

    config = config_or_exit()
    home = settings_or_exit().home
    path = capabilities_file(Path(os.environ.get("NANOCRAB_CONFIG_DIR") or home), os.environ)
    data = config.model_dump(mode="json")
    if json_:
        print_json(console, {"file": str(path) if path else None, "capability_config": data})
        return
    console.print(f"file: {path or 'none (the defaults)'}", highlight=False)
    console.print(f"permitted operations: {', '.join(sorted(config.permitted)) or 'none'}")
    console.print(yaml.safe_dump({"capability_config": data}, sort_keys=False), markup=False)


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
    config = config_or_exit()
    setup(settings, "nanocrab-capabilities")
    code = run_async(_invoke(settings, config, name, arguments, json_))
    raise typer.Exit(code)


async def _invoke(
    settings: Settings,
    config: CapabilityConfig,
    name: str,
    arguments: dict[str, Any],
    json_: bool,
) -> int:
    from nanocrab.capabilities.deps import blocked
    from nanocrab.cli.capabilities_render import describe_parameters, example_args, value_text
    from nanocrab.cli.host import bus_session, engine_for
    from nanocrab.cli.render import print_json
    from nanocrab.cli.wiring import sandbox_for
    from nanocrab.handlers.capgen import argument_errors, invoke
    from nanocrab.projections import capability, list_capabilities
    from nanocrab.projections.capabilities import dependency_nodes

    async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
        engine = engine_for(settings.db_url)
        try:
            await _fresh(log, engine, settings)
            detail = _known(await capability(engine, name), name)
            rows = await list_capabilities(engine, include_removed=True)
        finally:
            await engine.dispose()
        row = detail.row
        refused = refusal(row)
        if refused is not None:
            err.print(f"[red]{refused}[/]")
            return 1
        if why := blocked(dependency_nodes(rows), name, row.permissions, config):
            err.print(f"[red]{name} cannot run now: {why}[/]: not invoked", highlight=False)
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
            entry=row.entry, arguments=arguments, limits=config.limits.invocations(),
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
