"""Following a run from the terminal: start the runtime in this process when nothing serves the
data directory, publish the task, print its events as they come, answer approvals, and report
the outcome. The machinery behind ``run``, ``demo``, ``rerun``, ``cancel`` and ``say``, kept
apart from their declarations so that ``nanocrab --help`` does not import the bus."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec
import typer
from rich.text import Text

from nanocrab.bus import EventLog, RuntimeOptions, Stored, append_traced, read, read_run
from nanocrab.cli.agent import SessionFile
from nanocrab.cli.answers import answer_for, interactive, prompt_for
from nanocrab.cli.common import console, err
from nanocrab.cli.host import Host, RuntimeMarker, bus_connector, engine_for
from nanocrab.cli.ids import resolve_run
from nanocrab.cli.live import print_line, usage_table
from nanocrab.cli.render import print_json, stored_json, timeline_table
from nanocrab.cli.settings import Settings
from nanocrab.cli.shown import visible
from nanocrab.cli.wiring import build_reactors
from nanocrab.events import (
    ApprovalRequested,
    RunCancelled,
    RunCompleted,
    RunFailed,
    SessionArchived,
    TaskSubmitted,
)
from nanocrab.handlers.runstate import RunState, fold
from nanocrab.llm.base import Provider

ApprovalMode = Literal["prompt", "auto", "print"]


async def run_task(
    settings: Settings,
    task: TaskSubmitted,
    workspace: Path,
    wait_s: float,
    json_: bool,
    sessions: SessionFile | None,
    *,
    timeline: bool = False,
    provider: Provider | None = None,
    approvals: ApprovalMode | None = None,
    images: Sequence[tuple[str, bytes]] = (),
) -> int:
    """``images``: (file name, bytes) given with the task, stored in the object store by
    content hash and named by the task (``TaskSubmitted.images``) before it is published."""
    async with bus_connector(settings.bus(), sync=settings.sync) as bus:
        log, engine = bus.log, engine_for(settings.db_url)
        if images:
            task = await with_images(log, task, images)
        host: Host | None = None
        if provider is not None or (
            not RuntimeMarker(settings.home).alive() and settings.nats_url is None
        ):
            logs = await bus.open_runtime()  # each handler and the projectors as themselves
            reactors = build_reactors(
                log, engine, settings, default_workspace=workspace, provider=provider, log_for=logs
            )
            # the run has ended when this host stops: no pull is worth a grace period
            host = Host(
                log, engine, reactors, log_for=logs, options=RuntimeOptions(stop_grace_s=0.02)
            )
            await host.start()
        try:
            mode = approvals or ("prompt" if interactive() and not json_ else "print")
            return await follow(
                log, task, wait_s, json_, sessions, timeline=timeline, approvals=mode,
                settings=settings, approver=None if mode == "print" else await bus.open("approver"),
            )  # fmt: skip
        finally:
            if host:
                await host.stop()
            await engine.dispose()


async def with_images(
    log: EventLog, task: TaskSubmitted, images: Sequence[tuple[str, bytes]]
) -> TaskSubmitted:
    """``task`` naming ``images``, each fitted and stored in the object store."""
    from nanocrab.bus.artifacts import JetStreamArtifacts
    from nanocrab.tools.images import ImageTooLarge, store_image

    store = JetStreamArtifacts(log)
    blocks = []
    for name, data in images:
        try:
            blocks.append(await store_image(store, name, data))
        except (ImageTooLarge, ValueError) as exc:
            err.print(f"[red]--image {name}[/]: {exc}")
            raise typer.Exit(2) from exc
    return msgspec.structs.replace(task, images=[*task.images, *blocks])


async def follow(
    log: EventLog,
    task: TaskSubmitted,
    wait_s: float,
    json_: bool,
    sessions: SessionFile | None,
    *,
    timeline: bool,
    approvals: ApprovalMode = "print",
    settings: Settings | None = None,
    approver: EventLog | None = None,
) -> int:
    assert task.run_id is not None
    seen: list[Stored] = []
    outcome: RunCompleted | RunFailed | RunCancelled | None = None

    async def watch() -> None:
        nonlocal outcome
        async for s in read(log, log.subjects.run(task.run_id or ""), follow=True):
            seen.append(s)
            if json_:
                print_json(console, stored_json(s))
            else:
                print_line(console, s)
            if isinstance(s.event, ApprovalRequested) and settings is not None:
                await _on_approval(approver or log, s.event, settings, approvals)
            if isinstance(s.event, RunCompleted | RunFailed | RunCancelled):
                outcome = s.event
                return

    await append_traced(log, task)  # the root span of the run's trace
    try:
        await asyncio.wait_for(watch(), wait_s)
        if sessions is not None and task.session_id:
            await _follow_session(log, task.session_id, sessions)
    except TimeoutError:
        err.print(
            f"[bold red]run {task.run_id} did not finish within {wait_s:.0f}s[/]; it goes on in "
            f"the background: `nanocrab replay {task.run_id}`, `nanocrab cancel {task.run_id}`"
        )
        return 1
    if not json_:
        if timeline:
            console.print()
            console.print(timeline_table(task.run_id, seen))
        console.print(usage_table(seen))
        if isinstance(outcome, RunCompleted):
            console.print(Text.assemble("\n", ("answer:", "bold magenta"), " ",
                                        visible(outcome.reply)))  # fmt: skip
    if isinstance(outcome, RunCompleted):
        return 0
    if isinstance(outcome, RunFailed):
        err.print(Text.assemble((f"run failed ({outcome.kind}):", "bold red"), " ",
                                visible(outcome.reason)))  # fmt: skip
    elif isinstance(outcome, RunCancelled):
        err.print(Text.assemble(("run cancelled", "bold yellow"), " ", visible(outcome.reason)))
    return 1


async def _on_approval(
    log: EventLog, request: ApprovalRequested, settings: Settings, mode: ApprovalMode
) -> None:
    """``prompt``: ask the person at the terminal; ``auto`` (the demo only): approve once as
    this data directory's approver, saying so; ``print``: say how to answer from elsewhere."""
    if mode == "print":
        err.print(
            f"[yellow]waiting for approval[/] of {request.tool} ({request.tier}): "
            f"`nanocrab approve {request.approval_id}` or "
            f"`nanocrab deny {request.approval_id} --reason ...`"
        )
        return
    if mode == "auto":
        console.print(f"[dim]  demo: approving {request.tool} once as {settings.user}[/]")
        answer = answer_for(request, settings, grant=True)
    else:
        answer = await prompt_for(request, settings)
    await append_traced(log, answer, parent=request.trace)


async def _follow_session(log: EventLog, session_id: str, sessions: SessionFile) -> None:
    """After ``/new``: move the CLI to the session the orchestrator opened."""
    for s in await read_run_scope(log, log.subjects.session(session_id)):
        if isinstance(s.event, SessionArchived) and s.event.next_session_id:
            sessions.set(s.event.next_session_id)


async def read_run_scope(log: EventLog, scope: str) -> list[Stored]:
    return [s async for s in read(log, scope)]


async def live_run(log: EventLog, given: str) -> RunState:
    """The state of the live run ``given`` names (a whole id or a unique prefix or suffix)."""
    run_id = await resolve_run(log, given)
    events = await read_run(log, run_id)
    if not events:
        err.print(
            f"[red]no run {run_id!r}[/]; list runs with `nanocrab tail --all --type run.started`"
        )
        raise typer.Exit(1)
    state = fold(run_id, [(s.seq, s.event) for s in events if s.event is not None])
    if state.terminal:
        err.print(f"[red]run {run_id} is already {state.status}[/]")
        raise typer.Exit(1)
    return state
