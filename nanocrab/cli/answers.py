"""Answering an approval request: find it (a whole id, or a unique prefix or suffix of a pending
one), build the answer signed by this data directory's approver identity, append it to the run.
Used by ``approve`` and ``deny`` and by ``run``'s terminal prompt."""

from __future__ import annotations

import asyncio
import sys
from typing import Literal, TypedDict

import typer
from rich.prompt import Prompt
from rich.text import Text

from nanocrab.bus import EventLog, append_traced, read_run
from nanocrab.cli.common import console, err, settings_or_exit
from nanocrab.cli.host import bus_session, engine_for
from nanocrab.cli.ids import IdError, resolve_id
from nanocrab.cli.settings import Settings
from nanocrab.cli.shown import visible
from nanocrab.events import ApprovalDenied, ApprovalGranted, ApprovalRequested, utcnow
from nanocrab.projections import approval_row, catch_up_projection, pending_approvals
from nanocrab.security import KeyRing, sign

Answer = ApprovalGranted | ApprovalDenied


class _AnswerFields(TypedDict):
    """What a grant and a denial of one request share."""

    approval_id: str
    approver: str
    binding_hash: str
    run_id: str | None
    session_id: str | None
    task_id: str | None
    tenant: str
    source: str


def answer_for(
    request: ApprovalRequested,
    settings: Settings,
    *,
    grant: bool,
    remember: Literal["once", "session"] = "once",
    reason: str = "",
) -> Answer:
    """A signed answer to ``request`` from this CLI's approver identity."""
    keypair = KeyRing(settings.keys_dir).keypair("approver")
    common: _AnswerFields = {
        "approval_id": request.approval_id,
        "approver": settings.user,
        "binding_hash": request.binding_hash,
        "run_id": request.run_id,
        "session_id": request.session_id,
        "task_id": request.task_id,
        "tenant": request.tenant,
        "source": "approver",
    }
    answer: Answer = (
        ApprovalGranted(remember=remember, **common)
        if grant
        else ApprovalDenied(reason=reason, **common)
    )
    return sign(answer, keypair)


def describe(request: ApprovalRequested) -> Text:
    """The call as the person approving it must see it: every argument in full, and nothing
    of it read as markup or terminal codes (cli/shown.py)."""
    args = ", ".join(f"{k}={v!r}" for k, v in request.arguments.items())
    left = (request.expires_at - utcnow()).total_seconds()
    expires = f"\n  id {visible(request.approval_id)} · expires in {max(0, left):.0f}s"
    if request.about == "budget":  # a run over a spending cap asking for more
        return Text.assemble(("budget", "bold yellow"), ": ", visible(request.reason), expires)
    return Text.assemble(
        (visible(request.tier), "bold yellow"), " call needs approval: ",
        (visible(request.tool), "bold"), "(", visible(args), ")\n",
        "  why: ", visible(request.reason), expires,
    )  # fmt: skip


async def prompt_for(request: ApprovalRequested, settings: Settings) -> Answer:
    """Ask the person at the terminal (blocking input runs in a thread)."""
    console.print(describe(request))
    choices = ["y", "n", *(["s"] if "session" in request.options else [])]
    hint = "y = once, s = for this session, n = deny" if "s" in choices else "y = once, n = deny"
    choice = await asyncio.to_thread(
        Prompt.ask, f"  approve? ({hint})", choices=choices, default="n", console=console
    )
    if choice == "n":
        reason = await asyncio.to_thread(Prompt.ask, "  reason", default="", console=console)
        return answer_for(request, settings, grant=False, reason=reason)
    return answer_for(
        request, settings, grant=True, remember="session" if choice == "s" else "once"
    )


def interactive() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


async def _find(log: EventLog, settings: Settings, approval_id: str) -> ApprovalRequested:
    engine = engine_for(settings.db_url)
    try:
        await catch_up_projection(log, engine, "audit")
        row = await approval_row(engine, approval_id)
        if row is None:  # not a whole id or a unique prefix: a unique suffix of a pending one
            pending = [a.approval_id for a in await pending_approvals(engine)]
            try:
                row = await approval_row(engine, resolve_id(approval_id, pending, what="approval"))
            except IdError as exc:
                err.print(f"[red]{exc}[/]; list the pending ones with `nanocrab approvals`")
                raise typer.Exit(1) from exc
    finally:
        await engine.dispose()
    if row is None:
        err.print(
            f"[red]no approval {approval_id!r}[/]; list the pending ones with `nanocrab approvals`"
        )
        raise typer.Exit(1)
    assert row.run_id is not None  # an approval is always requested within a run
    for stored in await read_run(log, row.run_id):
        if isinstance(stored.event, ApprovalRequested) and (
            stored.event.approval_id == row.approval_id
        ):
            if row.status != "pending":
                err.print(f"[red]approval {row.approval_id} is already {row.status}[/]")
                raise typer.Exit(1)
            return stored.event
    err.print(f"[red]approval {row.approval_id} is not in run {row.run_id}'s log[/]")
    raise typer.Exit(1)


async def answer(approval_id: str, *, grant: bool, session: bool, reason: str) -> None:
    settings = settings_or_exit()
    async with bus_session(settings.bus(), sync=settings.sync, identity="approver") as (log, _):
        request = await _find(log, settings, approval_id)
        if session and "session" not in request.options:
            err.print(
                f"[red]--session is not offered for this {request.tier} call[/]: "
                "Unsafe calls are approved one at a time"
            )
            raise typer.Exit(2)
        answer = answer_for(
            request,
            settings,
            grant=grant,
            remember="session" if session else "once",
            reason=reason,
        )
        await append_traced(log, answer, parent=request.trace)  # joins the run's trace
    verb = "approved" if grant else "denied"
    scope = " for the rest of the session" if session else ""
    args = ", ".join(f"{k}={v!r}" for k, v in request.arguments.items())
    console.print(Text.assemble(  # the whole call answered, as it will run
        f"{verb}{scope}: ", (visible(request.tool), "bold"), "(", visible(args), ")\n",
        f"  id {visible(request.approval_id)}; follow with ",
        f"`nanocrab replay {visible(request.run_id or '')}`",
    ))  # fmt: skip
