"""``nanocrab branch``: a new session from any event of a run or session (``/branch`` in
``nanocrab run`` is the same, on the CLI's current session).

The branch is one ``session.branched`` event; nothing of the parent is copied. The CLI's current
session moves to the branch (``--no-switch`` keeps it), so the next ``nanocrab run`` continues
the branch with the parent's history up to the fork event (docs/agent.md, "Branching")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from nanocrab.cli.common import JsonOpt, app, console, err, run_async, settings_or_exit

if TYPE_CHECKING:
    from nanocrab.bus import EventLog
    from nanocrab.cli.settings import Settings
    from nanocrab.events import SessionBranched


async def make_branch(log: EventLog, target: str, at: str, *, by: str) -> SessionBranched:
    """Find the fork point in ``target`` (a run id, a unique part of one, or a session id),
    append the ``session.branched`` and return it. Exits 1 with the reason when not found."""
    from nanocrab.branching import BranchError, fork_in_run, fork_point
    from nanocrab.bus import append_traced
    from nanocrab.cli.ids import IdError, resolve_id, run_ids

    try:
        if await log.last_seq(log.subjects.run(target)):
            point = await fork_in_run(log, target, at)
        else:
            try:
                run_id = resolve_id(target, await run_ids(log), what="run")
            except IdError as exc:
                if exc.kind != "unknown":
                    raise BranchError(str(exc)) from exc
                point = await fork_point(log, target, at)  # a session, or nothing at all
            else:
                point = await fork_in_run(log, run_id, at)
    except BranchError as exc:
        err.print(f"[red]cannot branch:[/] {exc}")
        raise typer.Exit(1) from exc
    branched = point.branch(by=by, source="cli")
    await append_traced(log, branched)
    return branched


def describe(branched: SessionBranched) -> str:
    return (
        f"branched session {branched.session_id} from run {branched.parent_run_id} at "
        f"{branched.at_type} {branched.at_event_id} (seq {branched.at_seq})"
    )


def branch_now(settings: Settings, target: str, at: str) -> SessionBranched:
    from nanocrab.cli.host import bus_session

    async def main() -> SessionBranched:
        async with bus_session(settings.bus(), sync=settings.sync) as (log, _):
            return await make_branch(log, target, at, by=settings.user)

    return run_async(main())


@app.command()
def branch(
    target: Annotated[
        str, typer.Argument(help="A run (its id, or a unique prefix or suffix) or a session id.")
    ],
    at: Annotated[
        str, typer.Option("--at", help="The event to fork at: its id, or a unique part of it.")
    ],
    switch: Annotated[
        bool,
        typer.Option(
            "--switch/--no-switch",
            help="Make the branch the CLI's current session, so `nanocrab run` continues it.",
        ),
    ] = True,
    json_: JsonOpt = False,
) -> None:
    """Start a new session from any event of a run or session.

    The branch shares the parent's history up to and including that event (nothing is
    copied); the parent is unchanged. `nanocrab replay` shows the tree."""
    from nanocrab.cli.agent import SessionFile
    from nanocrab.cli.render import print_json

    settings = settings_or_exit()
    branched = branch_now(settings, target, at)
    if switch and branched.session_id:
        SessionFile(settings.home).set(branched.session_id)
    if json_:
        print_json(
            console,
            {
                "session_id": branched.session_id,
                "parent_run_id": branched.parent_run_id,
                "parent_session_id": branched.parent_session_id,
                "at_event_id": branched.at_event_id,
                "at_seq": branched.at_seq,
                "at_type": branched.at_type,
                "event_id": branched.id,
            },
        )
        return
    console.print(describe(branched))
    if switch:
        console.print('[dim]the CLI\'s session is now the branch: `nanocrab run "..."`[/]')
