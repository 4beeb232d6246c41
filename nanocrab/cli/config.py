"""``nanocrab config history | diff V1 V2 | activate V | rollback | check``: configuration
versions (hot reload, docs/reload.md).

Declaring the commands imports only typer and :mod:`nanocrab.cli.common`; the bus, the events
and the loaders are imported when a command runs (tests/test_cli_lazy.py). ``activate`` and
``rollback`` ask the running reloader (``reload.requested``, identity ``cli``) and print its
answer: only the reloader switches versions.
"""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nanocrab.cli.common import JsonOpt, app, console, err, run_async, settings_or_exit

if TYPE_CHECKING:
    from nanocrab.bus import EventLog
    from nanocrab.cli.settings import Settings
    from nanocrab.events import Event, ReloadRequested

config_app = typer.Typer(
    help="Configuration versions: history, diff, activate, rollback (docs/reload.md).",
    no_args_is_help=True,
)
WaitOpt = Annotated[float, typer.Option(help="Seconds to wait for the reloader's answer.", min=0.0)]


@config_app.callback()
def _group() -> None:
    """Configuration versions: history, diff, activate, rollback (docs/reload.md)."""


@config_app.command("history")
def history_command(as_json: JsonOpt = False) -> None:
    """Every proposal, rejection, activation and rollback, oldest first; the active version
    is marked."""
    settings = settings_or_exit()
    run_async(_history(settings, as_json))


async def _history(settings: Settings, as_json: bool) -> None:
    from rich.table import Table

    from nanocrab.bus import read
    from nanocrab.cli.host import bus_session
    from nanocrab.events import (
        ReloadActivated,
        ReloadProposed,
        ReloadRejected,
        ReloadRequested,
        ReloadRolledBack,
    )

    async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
        rows = [s async for s in read(log, log.subjects.of_type("reload.*")) if s.event]
    active = ""
    for s in rows:
        if isinstance(s.event, ReloadActivated | ReloadRolledBack):
            active = s.event.version
    table = Table("seq", "time", "event", "version", "detail")
    for s in rows:
        e = s.event
        assert e is not None
        detail, version = "", ""
        match e:
            case ReloadProposed():
                detail, version = ", ".join(e.changed) or "(no change)", e.version
            case ReloadRejected():
                version = e.version
                detail = "; ".join(f"{p.file}:{p.line}: {p.message}" for p in e.problems)
            case ReloadActivated():
                detail, version = f"{e.reason}, from {_short(e.previous)}", e.version
            case ReloadRolledBack():
                kind = "automatic" if e.automatic else "manual"
                detail = f"{kind}, from {_short(e.from_version)}: {e.reason}"
                version = e.version
            case ReloadRequested():
                detail = f"{e.action} by {e.by or '?'}"
                version = e.version
        if as_json:
            print(json.dumps({"seq": s.seq, "time": e.time.isoformat(), "type": e.type,
                              "version": version, "detail": detail}))  # fmt: skip
            continue
        mark = " [bold green](active)[/]" if version and version == active else ""
        table.add_row(str(s.seq), f"{e.time:%Y-%m-%d %H:%M:%S}", e.type,
                      _short(version) + mark, detail)  # fmt: skip
    if not as_json:
        if not rows:
            console.print("no configuration versions yet: the start-up configuration is active")
            return
        console.print(table)


def _short(version: str) -> str:
    return version[:12] if version else "startup"


@config_app.command("diff")
def diff_command(
    v1: Annotated[str, typer.Argument(help="A version (a unique prefix will do).")],
    v2: Annotated[str, typer.Argument(help="Another version.")],
) -> None:
    """The unified diff between two proposed versions' snapshots."""
    settings = settings_or_exit()
    run_async(_diff(settings, v1, v2))


async def _diff(settings: Settings, v1: str, v2: str) -> None:
    from nanocrab.bus.artifacts import JetStreamArtifacts
    from nanocrab.cli.host import bus_session
    from nanocrab.handlers.reloader import known_versions
    from nanocrab.reload import Snapshot, diff

    async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
        versions = await known_versions(log)
        store = JetStreamArtifacts(log)
        snaps = []
        for prefix in (v1, v2):
            matches = [v for v in versions if v.startswith(prefix)]
            if len(matches) != 1:
                err.print(f"[bold red]version {prefix!r}[/] is "
                          f"{'unknown' if not matches else 'ambiguous'}")  # fmt: skip
                raise typer.Exit(2)
            ref = versions[matches[0]].snapshot
            snaps.append(Snapshot.decode(await store.get(ref)) if ref else Snapshot())
    changed, text = diff(snaps[0], snaps[1])
    if not changed:
        console.print("no difference")
        return
    print(text, end="")


@config_app.command("activate")
def activate_command(
    version: Annotated[str, typer.Argument(help="A proposed version (a unique prefix).")],
    wait: WaitOpt = 10.0,
) -> None:
    """Ask the reloader to switch new runs to VERSION (validated again first)."""
    settings = settings_or_exit()
    run_async(_request(settings, "activate", version, wait))


@config_app.command("rollback")
def rollback_command(wait: WaitOpt = 10.0) -> None:
    """Ask the reloader to switch new runs back to the version before the active one."""
    settings = settings_or_exit()
    run_async(_request(settings, "rollback", "", wait))


async def _request(settings: Settings, action: str, version: str, wait: float) -> None:
    from nanocrab.cli.host import bus_session
    from nanocrab.events import ReloadRequested

    request = ReloadRequested(
        action="activate" if action == "activate" else "rollback", version=version,
        by=getpass.getuser(),
    )  # fmt: skip
    async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
        await log.append(request)
        answer = await _answer(log, request, wait)
    if answer is None:
        err.print(f"requested ({request.id}); no reloader answered within {wait:g} s — is "
                  "`nanocrab up` running? It will answer when it starts.")  # fmt: skip
        raise typer.Exit(1)
    _print_answer(answer)


async def _answer(log: EventLog, request: ReloadRequested, wait: float) -> Event | None:
    import asyncio

    from nanocrab.bus import read

    async def find() -> Event | None:
        async for s in read(log, log.subjects.of_type("reload.*"), follow=True):
            if s.event is not None and s.event.causation_id == request.id:
                return s.event
        return None

    try:
        return await asyncio.wait_for(find(), wait)
    except TimeoutError:
        return None


def _print_answer(answer: Event) -> None:
    from nanocrab.events import ReloadActivated, ReloadRejected, ReloadRolledBack

    match answer:
        case ReloadActivated():
            console.print(f"[bold green]activated[/] {_short(answer.version)} "
                          f"(was {_short(answer.previous)})")  # fmt: skip
        case ReloadRolledBack():
            console.print(f"[bold yellow]rolled back[/] {_short(answer.from_version)} → "
                          f"{_short(answer.version)}")  # fmt: skip
        case ReloadRejected():
            for p in answer.problems:
                err.print(f"[bold red]refused:[/] {p.file}:{p.line}: {p.message}")
            raise typer.Exit(2)
        case _:
            console.print(answer.type)


@config_app.command("check")
def check_command(
    directory: Annotated[
        Path | None, typer.Argument(help="The configuration directory (default: the watched one).")
    ] = None,
) -> None:
    """Validate a configuration directory as the reloader would, without the bus: each
    problem as file:line. Exit status 2 when there is one."""
    from nanocrab.reload import collect, validate

    if directory is None:
        from nanocrab.cli.wiring import config_dir

        directory = config_dir(settings_or_exit())
    snapshot = collect(directory)
    problems = validate(snapshot)
    for p in problems:
        err.print(f"[bold red]{p.file}:{p.line}:[/] {p.message}", soft_wrap=True)
    if problems:
        raise typer.Exit(2)
    console.print(f"ok: {len(snapshot.files)} files, version {_short(snapshot.version)}")


app.add_typer(config_app, name="config")
