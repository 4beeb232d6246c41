"""Slash commands: answered by the orchestrator at once, without a model call.

Add one by decorating a function ``(state) -> list[Event]`` with :func:`command`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nanocrab.events import Event, ReplySent, RunCompleted, SessionArchived, derive_event_id
from nanocrab.handlers.runstate import RunState

CommandFn = Callable[[RunState, str], list[Event]]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: CommandFn


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str) -> Callable[[CommandFn], CommandFn]:
    def register(fn: CommandFn) -> CommandFn:
        COMMANDS[name] = Command(name, help, fn)
        return fn

    return register


def answer(text: str) -> list[Event]:
    return [ReplySent(text=text), RunCompleted(reply=text, steps=0)]


def run_command(state: RunState) -> list[Event]:
    assert state.task is not None
    name, _, rest = state.task.text.strip()[1:].partition(" ")
    found = COMMANDS.get(name.lower())
    if found is None:
        return answer(f"Unknown command /{name}. " + _help_text())
    return found.run(state, rest.strip())


def _help_text() -> str:
    lines = ["Commands:"] + [
        f"  /{c.name} — {c.help}" for c in sorted(COMMANDS.values(), key=lambda c: c.name)
    ]
    lines.append("Anything else is a task for the agent.")
    return "\n".join(lines)


@command("help", "list the commands")
def _help(state: RunState, args: str) -> list[Event]:
    return answer(_help_text())


@command("new", "start a new session (the old one is archived in the background)")
def _new(state: RunState, args: str) -> list[Event]:
    assert state.task is not None
    old = state.task.session_id
    new = derive_event_id("session", state.task.id, 0)
    text = f"Started a new session ({new})." + (f" Archived {old}." if old else "")
    archived: list[Event] = (
        [SessionArchived(session_id=old, reason="/new", next_session_id=new)] if old else []
    )
    return [ReplySent(text=text), *archived, RunCompleted(reply=text, steps=0)]


@command("branch", "start a new session from any event of this one (`/branch EVENT_ID`)")
def _branch(state: RunState, args: str) -> list[Event]:
    """Answered by the front end that finds the event on the log (``nanocrab run`` does);
    a run cannot read the log, so one that gets here says where branching is done."""
    return answer(
        "Branching starts a new session from any event of a run: `/branch EVENT_ID` in "
        "`nanocrab run`, `nanocrab branch RUN_OR_SESSION --at EVENT_ID`, or "
        "POST /v1/runs/{run_id}/branch on the gateway."
    )
