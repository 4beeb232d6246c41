"""``nanocrab capabilities generate`` (registered by :mod:`nanocrab.cli.capabilities`): ask for
a capability and follow its generation live.

Publishes ``capability.requested`` as ``cli`` and shows every attempt of the ``capgen`` handler
(code generated, findings, test results) until a version is registered or the attempts are
spent. Hosts the handler in-process when no ``nanocrab up`` serves the data directory.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

import typer

from nanocrab.cli.common import (
    JsonOpt,
    console,
    err,
    run_async,
    settings_or_exit,
    setup,
)

if TYPE_CHECKING:
    from nanocrab.bus import EventLog
    from nanocrab.capabilities.config import CapabilityConfig
    from nanocrab.cli.settings import Settings
    from nanocrab.events import CapabilityRegistered, CapabilityRequested, Event


def generate(
    guidance: Annotated[str, typer.Argument(help="What the capability should do, in words.")],
    name: Annotated[
        str, typer.Option(help="Its name (snake_case); default: the model chooses.")
    ] = "",
    attempts: Annotated[
        int, typer.Option(min=1, max=10, help="Generation attempts before giving up.")
    ] = 3,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the outcome.")] = 600.0,
    enable: Annotated[
        bool,
        typer.Option(
            "--enable",
            help="Enable the registered version at once (default: it waits, disabled, for "
            "`nanocrab capabilities enable NAME`).",
        ),
    ] = False,
    json_: JsonOpt = False,
) -> None:
    """Have the model write a capability, scan it, test it in the sandbox and register it.

    Shows every attempt live: the code generated, the scanner's findings, each test's result,
    and finally the registered version, its content hash and safety level. A capability new to
    the registry stays disabled until you enable it (or pass --enable). Exits 1 when no
    attempt passed. Uses Claude when ANTHROPIC_API_KEY is set, else the offline model (which
    knows how to write a word counter)."""
    from nanocrab.events import CapabilityRequested

    if not guidance.strip():
        err.print("[red]the guidance is empty[/]; say what the capability should do, in quotes")
        raise typer.Exit(2)
    if name and not re.fullmatch(r"[a-z][a-z0-9_]{1,47}", name):
        err.print(
            f"[red]--name {name!r} is not a capability name[/]: use 2-48 lowercase letters, "
            "digits and underscores, starting with a letter, e.g. word_count"
        )
        raise typer.Exit(2)
    from nanocrab.cli.capabilities import config_or_exit

    settings = settings_or_exit()
    config = config_or_exit()  # capabilities.yaml: a bad one exits 2 with its file:line
    setup(settings, "nanocrab-capabilities")
    request = CapabilityRequested(
        name=name, guidance=guidance, max_attempts=attempts, requested_by=settings.user
    )
    code = run_async(_generate(settings, config, request, timeout, json_, enable=enable))
    raise typer.Exit(code)


async def _generate(
    settings: Settings,
    config: CapabilityConfig,
    request: CapabilityRequested,
    wait_s: float,
    json_: bool,
    *,
    enable: bool,
) -> int:
    from nanocrab.bus.permissions import CAPGEN, PROJECTOR
    from nanocrab.cli.host import Host, RuntimeMarker, bus_connector, engine_for
    from nanocrab.cli.wiring import build_capgen
    from nanocrab.projections import CapabilitiesProjection

    async with bus_connector(settings.bus(), sync=settings.sync) as bus:
        log, engine = bus.log, engine_for(settings.db_url)
        host: Host | None = None
        if not RuntimeMarker(settings.home).alive() and settings.nats_url is None:
            logs = await bus.connector.open_all([CAPGEN, PROJECTOR])
            host = Host(
                log, engine, [build_capgen(logs(CAPGEN), settings, config=config)],
                projections=[CapabilitiesProjection()], log_for=logs,
            )  # fmt: skip
            await host.start()
        try:
            return await _follow(log, request, wait_s, json_, enable=enable)
        finally:
            if host is not None:
                await host.stop()
            await engine.dispose()


async def _follow(
    log: EventLog, request: CapabilityRequested, wait_s: float, json_: bool, *, enable: bool
) -> int:
    import asyncio

    from nanocrab.bus import Window, read
    from nanocrab.cli.capabilities_render import example_args, progress_lines
    from nanocrab.cli.render import print_json, stored_json
    from nanocrab.events import CapabilityEnabled, CapabilityRegistered, CapabilityTested

    appended = await log.append(request)
    if not json_:
        console.print(f"[dim]asked for a capability ({appended.event_id}); generating…[/]")
    outcome: Event | None = None

    async def watch() -> None:
        nonlocal outcome
        window = Window(start_seq=appended.seq)
        async for s in read(log, log.subjects.of_type("capability.*"), window, follow=True):
            e = s.event
            if e is None or (e.id != request.id and e.causation_id != request.id):
                continue
            if json_:
                print_json(console, stored_json(s))
            else:
                for line in progress_lines(e):
                    console.print(line)
            if isinstance(e, CapabilityRegistered) or (
                isinstance(e, CapabilityTested) and e.final and not e.passed
            ):
                outcome = e
                return

    try:
        await asyncio.wait_for(watch(), wait_s)
    except TimeoutError:
        err.print(
            f"[bold red]no outcome within {wait_s:.0f}s[/]: is a capgen handler running "
            "(`nanocrab up`)? The request stays in the log and is handled when one starts; "
            "follow it with `nanocrab tail --all --type 'capability.*'`"
        )
        return 1
    if isinstance(outcome, CapabilityRegistered):
        blocked = await _unmet(log, outcome) if enable else []
        if enable and not blocked:  # the user's decision, published as the user
            await log.append(
                CapabilityEnabled(
                    name=outcome.name, version=outcome.version, requires=outcome.requires,
                    source="cli",
                )
            )  # fmt: skip
        if not json_:
            if blocked:
                err.print(
                    f"[yellow]not enabled[/]: it requires {'; '.join(blocked)}; enable with "
                    f"`nanocrab capabilities enable {outcome.name} --with-deps`",
                    highlight=False,
                )
            console.print(
                f"[green]enabled[/] {outcome.name} {outcome.version}"
                if enable and not blocked
                else f"a capability new to the registry stays disabled until you allow it: "
                f"nanocrab capabilities enable {outcome.name}",
                highlight=False,
            )
            console.print(
                f"try it: nanocrab capabilities invoke {outcome.name} "
                f"--args '{example_args(outcome.parameters)}'"
            )
        return 0
    if not json_ and isinstance(outcome, CapabilityTested):
        err.print(
            f"[bold red]nothing registered[/]: {outcome.report}. Make the guidance more precise "
            "or allow more --attempts."
        )
    return 1


async def _unmet(log: EventLog, registered: CapabilityRegistered) -> list[str]:
    """What keeps ``registered`` from being enabled now: its dependencies not enabled."""
    if not registered.requires:
        return []
    from nanocrab.bus.direct import DirectReader
    from nanocrab.capabilities.deps import Node, problems
    from nanocrab.handlers.capgen.handler import registry_from_log

    reader = DirectReader(log.nc, log.cfg.log_stream, leader_only=not log.direct)
    nodes = await registry_from_log(log, reader)
    nodes[registered.name] = Node(enabled=False, requires=tuple(registered.requires))
    return problems(nodes, registered.name)
