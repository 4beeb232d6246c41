"""The approval front end: ``nanocrab approve`` / ``deny`` and the prompt inside ``run``.

An answer is an ``approval.granted`` / ``approval.denied`` signed with this data directory's
approver key (``<home>/keys/approver.nk``) and bound to the request's hash, so it answers that
one call and nothing else. The policy handler decides what the answer is worth (a trusted key,
not expired, the run still going, the first answer wins).

This module declares the commands; :mod:`nanocrab.cli.answers` does the work and is imported
when one runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from nanocrab.cli.common import app, run_async, settings_or_exit, setup


@app.command()
def approve(
    approval_id: Annotated[
        str, typer.Argument(help="The approval id (a unique prefix or suffix works).")
    ],
    session: Annotated[
        bool, typer.Option("--session", help="Also allow this rule's calls for the session.")
    ] = False,
) -> None:
    """Approve one pending Guarded/Unsafe call (see `nanocrab approvals`)."""
    from nanocrab.cli.answers import answer

    setup(settings_or_exit(), "nanocrab-approve")
    run_async(answer(approval_id, grant=True, session=session, reason=""))


@app.command()
def deny(
    approval_id: Annotated[
        str, typer.Argument(help="The approval id (a unique prefix or suffix works).")
    ],
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the audit).")] = "",
) -> None:
    """Deny one pending call; the agent is told it was refused and why."""
    from nanocrab.cli.answers import answer

    setup(settings_or_exit(), "nanocrab-deny")
    run_async(answer(approval_id, grant=False, session=False, reason=reason))
