"""Commands. Each one reads :class:`Settings`, wires what it needs, and says what to do next on
failure. Each imports what it uses when it runs, so ``nanocrab --help`` stays fast."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nanocrab.cli.common import (
    JsonOpt,
    app,
    console,
    err,
    projections_app,
    run_async,
    settings_or_exit,
    setup,
    until_signalled,
)

if TYPE_CHECKING:
    from nanocrab.bus import Stored


@app.command()
def up(
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus metrics on http://HOST:PORT/metrics (docs/observability.md)."
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(help="The address the metrics endpoint listens on.")
    ] = "127.0.0.1",
) -> None:
    """Run the embedded server (or use NANOCRAB_NATS_URL), every handler and every projector
    until Ctrl-C."""
    import asyncio
    import signal
    from pathlib import Path

    from nanocrab.cli.host import Host, RuntimeMarker, bus_connector, engine_for
    from nanocrab.cli.wiring import build_reactors

    settings = settings_or_exit()
    setup(settings, "nanocrab-up")
    if metrics_port is not None or settings.traces == "otlp":
        from nanocrab.observe import configure_telemetry

        configure_telemetry(
            "nanocrab-up", otlp_metrics=settings.traces == "otlp", metrics_port=metrics_port,
            metrics_host=metrics_host,
        )  # fmt: skip

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        marker = RuntimeMarker(settings.home)
        async with bus_connector(settings.bus(), name="nanocrab-up", sync=settings.sync) as bus:
            log, engine = bus.log, engine_for(settings.db_url)
            logs = await bus.open_runtime()  # each handler and the projectors as themselves
            reactors = build_reactors(
                log, engine, settings, default_workspace=Path.cwd(), log_for=logs,
                memory_every_s=2.0,  # new memories embedded in the background
            )  # fmt: skip
            # projectors in a process of their own: they take nothing from the handlers' loop
            host = Host(log, engine, reactors, log_for=logs, projectors_in="process")
            await host.start()
            marker.write()
            where = bus.server.url if bus.server else settings.nats_url
            served = contextlib.AsyncExitStack()
            if settings.gateway is not None:  # NANOCRAB_GATEWAY: the HTTP gateway, this process
                from nanocrab.cli.gateway import gateway_app_for
                from nanocrab.gateway.server import serving

                web = await served.enter_async_context(gateway_app_for(settings, bus))
                await served.enter_async_context(serving(web, *settings.gateway))
            console.print(f"[bold green]nanocrab up[/] on {where} · data in {settings.home}")
            if settings.gateway is not None:
                gw_host, gw_port = settings.gateway
                console.print(f"  gateway and web view on http://{gw_host}:{gw_port}")
            if metrics_port is not None:
                console.print(f"  metrics on http://{metrics_host}:{metrics_port}/metrics")
            console.print(
                f"  handlers: {', '.join(r.durable for r in host.runtimes)} · projections: "
                f"{', '.join(p.name for p in host.projections)} · Ctrl-C to stop"
            )
            try:
                await stop.wait()
            finally:
                await served.aclose()
                console.print("stopping: finishing in-flight events…")
                await host.stop()
                marker.clear()
                await engine.dispose()
        console.print("[green]stopped cleanly[/]")

    run_async(main())


@app.command()
def publish(
    text: Annotated[str, typer.Argument(help="The task, in plain words.")],
    agent: Annotated[str, typer.Option(help="Agent profile.")] = "default",
    run_id: Annotated[
        str | None, typer.Option(help="Use this run id (default: a new ULID).")
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """Publish a task.submitted event and print its run id (handlers pick it up when running)."""
    from nanocrab.bus import append_traced
    from nanocrab.cli.agent import check_text, new_task
    from nanocrab.cli.host import RuntimeMarker, bus_session
    from nanocrab.cli.render import print_json

    check_text(text)
    settings = settings_or_exit()

    async def main() -> None:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            event = new_task(text, agent, run_id)
            appended = await append_traced(log, event)  # the root span of the run's trace
        if json_:
            print_json(
                console,
                {
                    "run_id": event.run_id,
                    "event_id": event.id,
                    "seq": appended.seq,
                    "subject": appended.subject,
                    "duplicate": appended.duplicate,
                },
            )
        else:
            console.print(
                f"published [bold]{event.type}[/] seq={appended.seq} run=[bold]{event.run_id}[/]"
            )
            if not RuntimeMarker(settings.home).alive() and settings.nats_url is None:
                console.print(
                    "[dim]no `nanocrab up` is running: it will be handled when one starts[/]"
                )

    run_async(main())


@app.command()
def tail(
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run.")] = None,
    type_: Annotated[
        str | None, typer.Option("--type", help="Type pattern: 'tool', 'run.*', 'llm.responded'.")
    ] = None,
    from_start: Annotated[
        bool, typer.Option("--all", help="Start at the beginning of the log.")
    ] = False,
    json_: JsonOpt = False,
) -> None:
    """Follow events as they are appended (Ctrl-C to stop)."""
    from datetime import UTC, datetime

    from rich.markup import escape

    from nanocrab.bus import Window, read
    from nanocrab.cli.host import bus_session
    from nanocrab.cli.ids import resolve_run
    from nanocrab.cli.patterns import type_pattern_error
    from nanocrab.cli.render import event_line, print_json, stored_json

    settings = settings_or_exit()
    if run_id and type_:
        err.print("[red]use --run or --type, not both[/] (a NATS filter has one subject)")
        raise typer.Exit(2)
    unknown = type_pattern_error(type_) if type_ else None
    if unknown:
        err.print(f"[red]--type:[/] {escape(unknown)}")
        raise typer.Exit(2)

    async def main() -> None:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            try:
                subject = (
                    log.subjects.run(await resolve_run(log, run_id, missing_ok=True))
                    if run_id
                    else log.subjects.of_type(type_)
                    if type_
                    else log.subjects.log_all
                )
            except ValueError as exc:
                err.print(f"[red]{exc}[/]")
                raise typer.Exit(2) from exc
            window = Window() if from_start else Window(start_time=datetime.now(UTC))

            async def follow() -> None:
                async for s in read(log, subject, window, follow=True):
                    print_json(console, stored_json(s)) if json_ else console.print(event_line(s))

            await until_signalled(follow())

    with contextlib.suppress(KeyboardInterrupt):
        run_async(main())


@app.command()
def replay(run_id: str, json_: JsonOpt = False) -> None:
    """Show every event of a run from the log, with timings and causes."""
    from nanocrab.branching import RunTree, run_tree
    from nanocrab.bus import read_run
    from nanocrab.cli.host import bus_session
    from nanocrab.cli.ids import resolve_run
    from nanocrab.cli.render import print_json, stored_json, timeline_table
    from nanocrab.cli.tree import tree_view
    from nanocrab.events import TaskSubmitted

    settings = settings_or_exit()

    async def main() -> tuple[str, list[Stored], RunTree]:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            resolved = await resolve_run(log, run_id)
            events = await read_run(log, resolved)
            task = next((s.event for s in events if isinstance(s.event, TaskSubmitted)), None)
            session = task.session_id if task is not None else None
            return resolved, events, await run_tree(log, resolved, session)

    resolved, events, tree = run_async(main())
    if not events:
        err.print(
            f"[red]no events for run {resolved!r}[/]; "
            "list runs with `nanocrab tail --all --type run.started`"
        )
        raise typer.Exit(1)
    if json_:
        for s in events:
            print_json(console, stored_json(s))
    else:
        console.print(timeline_table(resolved, events))
        if not tree.empty:  # branched sessions around this run (nanocrab branch)
            task = next((s.event for s in events if isinstance(s.event, TaskSubmitted)), None)
            console.print(tree_view(resolved, task.session_id if task else None, tree))


@projections_app.command("rebuild")
def projections_rebuild(
    name: Annotated[str | None, typer.Argument(help="One projection (default: all).")] = None,
) -> None:
    """Drop a projection and rebuild it from sequence 0, with progress."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from nanocrab.cli.host import bus_session, engine_for
    from nanocrab.projections import Projector, all_projections

    settings = settings_or_exit()
    chosen = [p for p in all_projections() if name in (None, p.name)]
    if not chosen:
        names = ", ".join(p.name for p in all_projections())
        err.print(f"[red]no projection named {name!r}[/]; known: {names}")
        raise typer.Exit(2)

    async def main() -> None:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            engine = engine_for(settings.db_url)
            try:
                with Progress(
                    "[progress.description]{task.description}",
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeRemainingColumn(),
                    console=console,
                ) as bar:
                    for projection in chosen:
                        task = bar.add_task(projection.name, total=None)
                        projector = Projector(log, engine, projection)

                        def update(done: int, total: int, task: Any = task) -> None:
                            bar.update(task, completed=done, total=total)

                        applied = await projector.rebuild(update)
                        bar.update(task, description=f"{projection.name} ({applied} events)")
            finally:
                await engine.dispose()

    run_async(main())


@app.command()
def status(json_: JsonOpt = False) -> None:
    """Streams, handler consumers (pending, unacked, redelivered), projection lag, dead letters."""
    from rich.markup import escape
    from rich.table import Table

    from nanocrab.cli.host import RuntimeMarker, bus_session, engine_for
    from nanocrab.cli.observers import server_info
    from nanocrab.cli.render import print_json
    from nanocrab.cli.status import gather_status

    settings = settings_or_exit()

    async def main() -> dict[str, Any]:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, server):
            engine = engine_for(settings.db_url)
            try:
                out = await gather_status(log, engine)
            finally:
                await engine.dispose()
            out["runtime_up"] = RuntimeMarker(settings.home).alive()
            out["home"] = str(settings.home)
            out["server"] = server_info(settings, server)
            return out

    out = run_async(main())
    if json_:
        print_json(console, out)
        return
    console.print(f"data directory: {out['home']}")
    srv = out["server"]
    console.print(f"server: {srv['url']} ({srv['lifetime']})", highlight=False, soft_wrap=True)
    console.print(f"connect: {srv['connect']}", highlight=False, soft_wrap=True)
    t = Table(title="streams", title_justify="left")
    for col in ("name", "messages", "bytes", "last seq"):
        t.add_column(col)
    for s in out["streams"]:
        t.add_row(s["name"], str(s["messages"]), str(s["bytes"]), str(s["last_seq"]))
    console.print(t)
    for s in out["streams"]:  # replicated streams: the cluster's health (docs/scaling.md)
        if s.get("cluster"):
            c = s["cluster"]
            peers = ", ".join(
                f"{r['name']} " + ("[red]offline[/]" if r["offline"] else "current" if
                                   r["current"] else f"[yellow]behind {r['lag']}[/]")
                for r in c["replicas"]
            )  # fmt: skip
            console.print(
                f"  {s['name']} on cluster {c['name']}: leader {c['leader'] or '[red]none[/]'}"
                + (f"; {peers}" if peers else ""),
                highlight=False,
            )
    for problem in out["problems"]:
        console.print(f"[bold red]problem:[/] {escape(problem)}")
    c = Table(title="handler consumers", title_justify="left")
    for col in ("name", "pending", "unacked", "redelivered", "behind"):
        c.add_column(col)
    for x in out["consumers"]:
        c.add_row(
            x["name"], str(x["pending"]), str(x["unacked"]), str(x["redelivered"]), str(x["behind"])
        )
    console.print(c)
    p = Table(title="projections", title_justify="left")
    for col in ("name", "position", "behind", "error"):
        p.add_column(col)
    for x in out["projections"]:
        error = x["error"] and f"[bold red]{escape(x['error'])}[/] ({x['attempts']} attempts)"
        p.add_row(x["name"], str(x["position"]), str(x["behind"]), error or "")
    console.print(p)
    dl = out["dead_letters"]
    console.print(
        f"dead letters: [{'bold red' if dl else 'green'}]{dl}[/]"
        + ("  (list them with `nanocrab dead-letters`)" if dl else "")
    )
    console.print(
        "runtime (nanocrab up): "
        + ("[green]running[/]" if out["runtime_up"] else "[dim]not running[/]")
    )


@app.command("dead-letters")
def dead_letters_cmd(
    limit: Annotated[int, typer.Option(help="Newest first, at most this many.")] = 50,
    json_: JsonOpt = False,
) -> None:
    """Messages handlers could not process: which handler, why, and where the bytes are."""
    from rich.table import Table
    from sqlalchemy.exc import OperationalError

    from nanocrab.cli.host import engine_for
    from nanocrab.cli.render import print_json
    from nanocrab.projections import list_dead_letters

    settings = settings_or_exit()

    async def main() -> list[dict[str, Any]]:
        engine = engine_for(settings.db_url)
        try:
            return await list_dead_letters(engine, limit)
        except OperationalError:  # not projected yet: no table
            return []
        finally:
            await engine.dispose()

    rows = run_async(main())
    if json_:
        for row in rows:
            print_json(console, row)
        return
    if not rows:
        console.print("[green]no dead letters[/]")
        return
    t = Table(title="dead letters (newest first)", title_justify="left")
    for col in ("stream seq", "handler", "kind", "reason", "deliveries"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            str(r["stream_seq"]), r["handler"], r["reason_kind"], r["reason"], str(r["deliveries"])
        )
    console.print(t)
    console.print("[dim]original bytes: `nats stream get NANOCRAB_LOG <stream seq>`[/]")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
