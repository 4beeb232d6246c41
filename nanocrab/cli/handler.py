"""``nanocrab handler NAME``: one handler (or the projectors) in a process of its own.

The scaled-out deployment (docs/scaling.md, compose.yaml) runs each handler as its own process,
as many instances as its load needs, against a NATS cluster and PostgreSQL. Instances of one
handler share its durable consumer, so JetStream splits the events between them; a killed
instance's unacknowledged events are redelivered to the others after their ack wait.

Each process connects only as its own identity. On a handler host the keys directory holds that
identity's seed and the public keys it verifies with (cli/provision.py): an executor host checks
the policy's signature on a grant but has no policy seed to mint one.
"""

from __future__ import annotations

from typing import Annotated

import typer

from nanocrab.cli.common import app, console, err, run_async, settings_or_exit, setup


@app.command()
def handler(
    name: Annotated[
        str,
        typer.Argument(
            help="orchestrator, policy, executor, llm, capgen, guardrails, router, reloader, "
            "telemetry, pyagent (Python agents), or projector (every projection)."
        ),
    ],
    instances: Annotated[
        int,
        typer.Option(min=1, max=64, help="Start this many processes of it (they share the work)."),
    ] = 1,
    ack_wait: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds before an event a dead instance held goes to another one (long "
            "work sends in-progress acks, so this bounds failover, not work).",
        ),
    ] = 30.0,
) -> None:
    """Run one handler, or the projectors, in its own process as its own NATS identity, until
    Ctrl-C or SIGTERM. Needs NANOCRAB_NATS_URL (a cluster: `nanocrab cluster up`)."""
    from nanocrab.cli.provision import HOST_IDENTITIES

    if name not in HOST_IDENTITIES:
        err.print(f"[red]unknown handler {name!r}[/]; known: {', '.join(HOST_IDENTITIES)}")
        raise typer.Exit(2)
    settings = settings_or_exit()
    if settings.nats_url is None:
        err.print(
            "[red]`nanocrab handler` joins an existing bus:[/] set NANOCRAB_NATS_URL (start a "
            "local cluster with `nanocrab cluster up`), or run everything with `nanocrab up`"
        )
        raise typer.Exit(2)
    if instances > 1:
        if name == "projector":
            err.print(
                "[red]one projector process per database:[/] each projection keeps one "
                "position; a restarted projector resumes from it"
            )
            raise typer.Exit(2)
        raise typer.Exit(_instances(name, instances, ack_wait))
    setup(settings, f"nanocrab-{name}")
    run_async(_serve(name, ack_wait))


def _instances(name: str, count: int, ack_wait: float) -> int:
    """Start ``count`` processes of ``nanocrab handler NAME``, pass SIGINT/SIGTERM on, wait for
    all; the exit code is the first non-zero one."""
    import signal
    import subprocess
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "nanocrab", "handler", name, "--ack-wait", str(ack_wait)]
        )
        for _ in range(count)
    ]
    console.print(f"{name}: {count} processes ({', '.join(str(p.pid) for p in procs)})")

    def forward(sig: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c not in (0, -signal.SIGTERM, -signal.SIGINT)), 0)


async def _serve(name: str, ack_wait: float) -> None:
    import asyncio
    import os
    import signal
    from pathlib import Path

    from nanocrab.bus import EventLog, RuntimeOptions
    from nanocrab.cli.host import Host, bus_connector, engine_for
    from nanocrab.cli.provision import HostKeys
    from nanocrab.cli.wiring import build_reactors

    settings = settings_or_exit()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    label = f"nanocrab-{name}-{os.getpid()}"
    async with bus_connector(settings.bus(), name=label, sync=settings.sync, identity=name) as bus:
        own = bus.log

        def log_for(_identity: str) -> EventLog:
            # every reactor built here appends as this process's identity; only ``name``'s runs
            return own

        engine = engine_for(settings.db_url)
        try:
            if name == "projector":
                host = Host(own, engine, [], log_for=log_for, projectors_in=None)
            else:
                reactors = build_reactors(
                    own, engine, settings, default_workspace=Path.cwd(), log_for=log_for,
                    keys=HostKeys(settings.keys_dir),
                    memory_every_s=2.0 if name == "router" else None,
                )  # fmt: skip
                chosen = [r for r in reactors if r.name == name]
                if not chosen:
                    err.print(
                        f"[red]{name} has nothing to do in this configuration[/] (guardrails "
                        "off, or no filter in the chain): do not start it"
                    )
                    raise typer.Exit(2)
                options = RuntimeOptions(ack_wait_s=ack_wait)
                host = Host(own, engine, chosen, projections=[], log_for=log_for, options=options)
            await host.start()
            console.print(
                f"[bold green]{name}[/] (pid {os.getpid()}) on {settings.nats_url} · "
                f"{'projections' if name == 'projector' else 'consumer'}: "
                + ", ".join([r.durable for r in host.runtimes] + [p.name for p in host.projectors])
            )
            try:
                await stop.wait()
            finally:
                await host.stop()
        finally:
            await engine.dispose()
