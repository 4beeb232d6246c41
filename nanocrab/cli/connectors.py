"""``nanocrab connectors list``: the mail accounts and calendars of ``connectors.yaml``
(docs/tools.md, "Connectors").

Registers the ``connectors`` sub-app on import. Imports only typer and the CLI's console at
module level. A credential is shown by name and as set or missing, never its value.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Annotated

import typer

from nanocrab.cli.common import JsonOpt, app, console, err, run_async

connectors_app = typer.Typer(
    help="Connectors (connectors.yaml): mail accounts and calendars.", no_args_is_help=True
)
app.add_typer(connectors_app, name="connectors")


@connectors_app.command("list")
def list_connectors(
    check: Annotated[
        bool, typer.Option("--check", help="Log in to the servers and read the calendars.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Every mail account and calendar: where it is, the credential it names and whether that
    is set; with --check, whether the servers accept it (nothing is sent or changed)."""
    from rich.markup import escape

    from nanocrab.cli.common import settings_or_exit
    from nanocrab.cli.wiring import config_dir
    from nanocrab.connectors import ConnectorConfigError, Credentials, load_connectors
    from nanocrab.connectors.check import entries
    from nanocrab.connectors.setup import connectors_file

    settings = settings_or_exit()
    path = connectors_file(config_dir(settings), os.environ)
    if path is None:
        err.print(
            f"no connectors: no {config_dir(settings) / 'connectors.yaml'} (or "
            "NANOCRAB_CONNECTORS); see docs/tools.md"
        )
        raise typer.Exit(1)
    try:
        config = load_connectors(path)
    except ConnectorConfigError as exc:
        err.print(f"[bold red]connectors.yaml error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    credentials = Credentials(file=config.credentials_path(path.parent), environ=os.environ)
    found = run_async(entries(config, path.parent, credentials, check=check))
    if as_json:
        for entry in found:
            print(json.dumps(dataclasses.asdict(entry)))
    for entry in [] if as_json else found:
        cred = ""
        if entry.credential is not None:
            state = "set" if entry.credential_set else "[red]missing[/]"
            cred = f"  credential {escape(entry.credential)}: {state}"
        line = f"[bold]{entry.kind}[/] {escape(entry.name)}  {escape(entry.where)}{cred}"
        console.print(line, highlight=False, soft_wrap=True)
        if entry.ok is not None:
            mark = "[green]ok[/]" if entry.ok else "[red]failed[/]"
            console.print(f"  {mark} {escape(entry.detail)}", highlight=False, soft_wrap=True)
    if check and any(e.ok is False for e in found):
        raise typer.Exit(1)
