"""Agent commands: ``run`` (publish a task and follow it live), ``demo``, ``cancel``, ``say``."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Annotated, Literal

import typer

from nanocrab import demo as demo_project
from nanocrab.bus import EventLog, Stored, append_traced, read, read_run
from nanocrab.cli.approve import answer_for, interactive, prompt_for
from nanocrab.cli.audit import print_run_audit
from nanocrab.cli.common import JsonOpt, app, console, err, run_async, settings_or_exit, setup
from nanocrab.cli.host import Host, RuntimeMarker, bus_connector, bus_session, engine_for
from nanocrab.cli.ids import resolve_run
from nanocrab.cli.live import print_line, usage_table
from nanocrab.cli.render import print_json, stored_json, timeline_table
from nanocrab.cli.settings import Settings
from nanocrab.cli.wiring import build_reactors
from nanocrab.events import (
    ApprovalRequested,
    Event,
    MessageQueued,
    RunCancelled,
    RunCompleted,
    RunFailed,
    SessionArchived,
    SubagentSpawned,
    TaskSubmitted,
    new_event_id,
)
from nanocrab.handlers.runstate import RunState, fold
from nanocrab.llm import ReplayProvider
from nanocrab.llm.base import Provider

ApprovalMode = Literal["prompt", "auto", "print"]


def check_text(text: str) -> None:
    if not text.strip():
        err.print("[red]the task text is empty[/]; say what the agent should do, in quotes")
        raise typer.Exit(2)


def new_task(
    text: str,
    agent: str,
    run_id: str | None,
    *,
    workspace: Path | None = None,
    session_id: str | None = None,
) -> TaskSubmitted:
    rid = run_id or new_event_id()
    return TaskSubmitted(
        text=text,
        agent=agent,
        run_id=rid,
        task_id=rid,
        session_id=session_id,
        workspace=str(workspace.resolve()) if workspace else None,
        source="cli",
    )


class SessionFile:
    """``<home>/session``: the CLI's current session id (``/new`` moves it on)."""

    def __init__(self, home: Path) -> None:
        self.path = home / "session"

    def current(self) -> str:
        try:
            value = self.path.read_text().strip()
        except FileNotFoundError:
            value = ""
        if not value:
            value = new_event_id()
            self.set(value)
        return value

    def set(self, session_id: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(session_id + "\n")


Workspace = Annotated[
    Path | None,
    typer.Option(help="Directory the agent may work in (default: the current directory)."),
]


@app.command()
def run(
    text: Annotated[str, typer.Argument(help="The task, in plain words (or /help, /new).")],
    agent: Annotated[str, typer.Option(help="Agent profile.")] = "default",
    workspace: Workspace = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the run to finish.")] = 600.0,
    json_: JsonOpt = False,
) -> None:
    """Publish a task, show the run live (turns, tool calls, tokens), print the answer.

    Exits 1 if the run fails. Starts the agent runtime in this process when no `nanocrab up`
    serves the data directory. Uses Claude when ANTHROPIC_API_KEY is set, else the offline
    scripted model."""
    check_text(text)
    settings = settings_or_exit()
    setup(settings, "nanocrab-run")
    ws = (workspace or Path.cwd()).resolve()
    if not ws.is_dir():
        err.print(f"[red]workspace {ws} is not a directory[/]")
        raise typer.Exit(2)
    sessions = SessionFile(settings.home)
    task = new_task(text, agent, None, workspace=ws, session_id=sessions.current())
    raise typer.Exit(run_async(_run_task(settings, task, ws, timeout, json_, sessions)))


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="Keep the demo workspace afterwards.")] = True,
) -> None:
    """The main job: an agent fixes a small broken project in a temporary workspace (reads
    files, edits one after an approval, runs the tests, answers), then the run's timeline,
    token usage and audit."""
    settings = settings_or_exit()
    setup(settings, "nanocrab-demo")
    ws = demo_project.make_workspace(Path(tempfile.mkdtemp(prefix="nanocrab-demo-")))
    console.print(f"[dim]demo workspace: {ws} · model: {settings.provider}[/]")
    task = new_task(demo_project.TASK, "default", None, workspace=ws, session_id=new_event_id())
    code = run_async(
        _run_task(settings, task, ws, 300.0, False, None, timeline=True, approvals="auto")
    )
    print_run_audit(settings, task.run_id or "")
    console.print(f"[dim]workspace kept at {ws}[/]" if keep else "")
    if not keep:
        import shutil

        shutil.rmtree(ws, ignore_errors=True)
    raise typer.Exit(code)


async def _run_task(
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
) -> int:
    async with bus_connector(settings.bus(), sync=settings.sync) as bus:
        log, engine = bus.log, engine_for(settings.db_url)
        host: Host | None = None
        if provider is not None or (
            not RuntimeMarker(settings.home).alive() and settings.nats_url is None
        ):
            logs = await bus.open_runtime()  # each handler and the projectors as themselves
            reactors = build_reactors(
                log, engine, settings, default_workspace=workspace, provider=provider, log_for=logs
            )
            host = Host(log, engine, reactors, log_for=logs)
            await host.start()
        try:
            mode = approvals or ("prompt" if interactive() and not json_ else "print")
            return await _follow(
                log, task, wait_s, json_, sessions, timeline=timeline, approvals=mode,
                settings=settings, approver=None if mode == "print" else await bus.open("approver"),
            )  # fmt: skip
        finally:
            if host:
                await host.stop()
            await engine.dispose()


async def _follow(
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
            console.print(f"\n[bold magenta]answer:[/] {outcome.reply}")
    if isinstance(outcome, RunCompleted):
        return 0
    if isinstance(outcome, RunFailed):
        err.print(f"[bold red]run failed ({outcome.kind}):[/] {outcome.reason}")
    elif isinstance(outcome, RunCancelled):
        err.print(f"[bold yellow]run cancelled[/] {outcome.reason}")
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


async def _live_run(log: EventLog, given: str) -> RunState:
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


@app.command()
def rerun(
    run_id: str,
    workspace: Workspace = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the run to finish.")] = 600.0,
) -> None:
    """Run a past run's task again on today's code, with the model's recorded responses.

    The replay provider serves the old run's `llm.responded` events turn by turn, so the model
    is taken out of the comparison while orchestrator, policy and tools run for real (in
    --workspace: point it at a fresh copy). Needs the runtime to itself: stop `nanocrab up`."""
    settings = settings_or_exit()
    setup(settings, "nanocrab-rerun")
    if RuntimeMarker(settings.home).alive() or settings.nats_url is not None:
        err.print(
            "[red]rerun needs its own handlers[/]: stop `nanocrab up` (or unset NANOCRAB_NATS_URL)"
        )
        raise typer.Exit(2)
    ws = (workspace or Path.cwd()).resolve()

    async def recorded() -> tuple[TaskSubmitted, list[Event]]:
        """The run's events and its subagents' (theirs are replayed too)."""
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            root = await resolve_run(log, run_id)
            events: list[Event] = []
            runs, seen = [root], set()
            while runs:
                current = runs.pop()
                if current in seen:
                    continue
                seen.add(current)
                found = [s.event for s in await read_run(log, current) if s.event is not None]
                runs += [e.child_run_id for e in found if isinstance(e, SubagentSpawned)]
                events += found
        tasks = [e for e in events if isinstance(e, TaskSubmitted) and e.run_id == root]
        if not tasks:
            err.print(f"[red]no run {run_id!r}[/]")
            raise typer.Exit(1)
        return tasks[0], events

    original, events = run_async(recorded())
    provider = ReplayProvider.from_events(events, root=original.run_id or run_id)
    task = new_task(original.text, original.agent, None, workspace=ws, session_id=new_event_id())
    console.print(
        f"[dim]re-running {original.run_id} as {task.run_id} with {len(provider.turns)} "
        "recorded turns[/]"
    )
    raise typer.Exit(
        run_async(
            _run_task(settings, task, ws, timeout, False, None, timeline=True, provider=provider)
        )
    )


@app.command()
def cancel(
    run_id: str,
    reason: Annotated[str, typer.Option(help="Why (recorded in the log).")] = "cancelled by user",
) -> None:
    """Cancel a running run: its in-flight tool is aborted and nothing further is decided."""
    settings = settings_or_exit()

    async def main() -> None:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            state = await _live_run(log, run_id)
            session = state.task.session_id if state.task else None
            await append_traced(
                log,
                RunCancelled(
                    run_id=state.run_id, reason=reason, by=settings.user, source="cli",
                    session_id=session,
                ),
                parent=state.task.trace if state.task else None,
            )  # fmt: skip
        console.print(f"[yellow]cancelled[/] run {state.run_id}")

    run_async(main())


@app.command()
def say(
    run_id: str,
    text: Annotated[str, typer.Argument(help="The message.")],
    steer: Annotated[
        bool,
        typer.Option(
            "--steer/--follow-up",
            help="--steer: deliver after the current tool call and skip the step's remaining "
            "calls; --follow-up (default): a new turn after the current one ends.",
        ),
    ] = False,
) -> None:
    """Send a message to a live run."""
    check_text(text)
    settings = settings_or_exit()

    async def main() -> None:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            state = await _live_run(log, run_id)
            mode: Literal["steer", "follow_up"] = "steer" if steer else "follow_up"
            session = state.task.session_id if state.task else None
            await append_traced(
                log,
                MessageQueued(
                    mode=mode, text=text, run_id=state.run_id, source="cli", session_id=session
                ),
                parent=state.task.trace if state.task else None,
            )
        console.print(f"queued {'steer' if steer else 'follow-up'} message for run {state.run_id}")

    run_async(main())
