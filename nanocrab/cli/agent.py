"""Agent commands: ``run`` (publish a task and follow it live), ``demo``, ``cancel``, ``say``.

This module declares them; each imports what it uses when it runs (the bus, the handlers,
:mod:`nanocrab.cli.follow`), so ``nanocrab --help`` stays fast."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from nanocrab.cli.common import JsonOpt, app, console, err, run_async, settings_or_exit, setup

if TYPE_CHECKING:
    from nanocrab.events import Event, TaskSubmitted


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
    from nanocrab.events import TaskSubmitted, new_event_id

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
            from nanocrab.events import new_event_id

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
    text: Annotated[
        str, typer.Argument(help="The task, in plain words (or /help, /new, /branch EVENT_ID).")
    ],
    agent: Annotated[str, typer.Option(help="Agent profile.")] = "default",
    workspace: Workspace = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the run to finish.")] = 600.0,
    json_: JsonOpt = False,
    image: Annotated[
        list[Path] | None,
        typer.Option(help="An image file to give the model with the task (repeatable)."),
    ] = None,
) -> None:
    """Publish a task, show the run live (turns, tool calls, tokens), print the answer.

    Exits 1 if the run fails. Starts the agent runtime in this process when no `nanocrab up`
    serves the data directory. Uses Claude when ANTHROPIC_API_KEY is set, else the offline
    scripted model."""
    from nanocrab.cli.follow import run_task

    check_text(text)
    settings = settings_or_exit()
    setup(settings, "nanocrab-run")
    ws = (workspace or Path.cwd()).resolve()
    if not ws.is_dir():
        err.print(f"[red]workspace {ws} is not a directory[/]")
        raise typer.Exit(2)
    sessions = SessionFile(settings.home)
    name, _, at = text.strip().partition(" ")
    if name == "/branch":  # answered here: the fork point is found on the log, not by a run
        from nanocrab.cli.branch import branch_now, describe

        if not at.strip():
            err.print("[red]/branch needs an event id[/]: /branch EVENT_ID (see `nanocrab replay`)")
            raise typer.Exit(2)
        branched = branch_now(settings, sessions.current(), at.strip())
        sessions.set(branched.session_id or sessions.current())
        console.print(describe(branched))
        raise typer.Exit(0)
    task = new_task(text, agent, None, workspace=ws, session_id=sessions.current())
    images = read_images(image or [])
    raise typer.Exit(
        run_async(run_task(settings, task, ws, timeout, json_, sessions, images=images))
    )


def read_images(paths: list[Path]) -> list[tuple[str, bytes]]:
    """Each ``--image`` file's name and bytes; exits 2 naming one that is missing or not an
    image (before anything is published)."""
    from nanocrab.tools.images import sniff_image

    out = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            err.print(f"[red]--image {path}[/]: {exc.strerror or exc}")
            raise typer.Exit(2) from exc
        if sniff_image(data) is None:
            err.print(f"[red]--image {path}[/] is not a PNG, JPEG, GIF or WebP image")
            raise typer.Exit(2)
        out.append((path.name, data))
    return out


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="Keep the demo workspace afterwards.")] = True,
) -> None:
    """The main job: an agent fixes a small broken project in a temporary workspace (reads
    files, edits one after an approval, runs the tests, answers), then the run's timeline,
    token usage and audit."""
    from nanocrab import demo as demo_project
    from nanocrab.cli.audit import print_run_audit
    from nanocrab.cli.follow import run_task
    from nanocrab.events import new_event_id

    settings = settings_or_exit()
    setup(settings, "nanocrab-demo")
    ws = demo_project.make_workspace(Path(tempfile.mkdtemp(prefix="nanocrab-demo-")))
    console.print(f"[dim]demo workspace: {ws} · model: {settings.provider}[/]")
    task = new_task(demo_project.TASK, "default", None, workspace=ws, session_id=new_event_id())
    code = run_async(
        run_task(settings, task, ws, 300.0, False, None, timeline=True, approvals="auto")
    )
    print_run_audit(settings, task.run_id or "")
    console.print(f"[dim]workspace kept at {ws}[/]" if keep else "")
    if not keep:
        import shutil

        shutil.rmtree(ws, ignore_errors=True)
    raise typer.Exit(code)


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
    from nanocrab.bus import read_run
    from nanocrab.cli.follow import run_task
    from nanocrab.cli.host import RuntimeMarker, bus_session
    from nanocrab.cli.ids import resolve_run
    from nanocrab.events import SubagentSpawned, TaskSubmitted, new_event_id
    from nanocrab.llm import ReplayProvider

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
    if original.images:  # the same stored images (content-addressed: nothing is copied)
        import msgspec

        task = msgspec.structs.replace(task, images=list(original.images))
    console.print(
        f"[dim]re-running {original.run_id} as {task.run_id} with {len(provider.turns)} "
        "recorded turns[/]"
    )
    raise typer.Exit(
        run_async(
            run_task(settings, task, ws, timeout, False, None, timeline=True, provider=provider)
        )
    )


@app.command()
def cancel(
    run_id: str,
    reason: Annotated[str, typer.Option(help="Why (recorded in the log).")] = "cancelled by user",
) -> None:
    """Cancel a running run: its in-flight tool is aborted and nothing further is decided."""
    from nanocrab.bus import append_traced
    from nanocrab.cli.follow import live_run
    from nanocrab.cli.host import bus_session
    from nanocrab.events import RunCancelled

    settings = settings_or_exit()

    async def main() -> None:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            state = await live_run(log, run_id)
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
    from nanocrab.bus import append_traced
    from nanocrab.cli.follow import live_run
    from nanocrab.cli.host import bus_session
    from nanocrab.events import MessageQueued

    check_text(text)
    settings = settings_or_exit()

    async def main() -> None:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            state = await live_run(log, run_id)
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
