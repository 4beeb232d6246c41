"""``nanocrab route "text" [--explain] [--json]``: which agent a task would go to, and why.

Imports only typer at module level; the embedder and the agents file load when it runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from nanocrab.cli.common import JsonOpt, app, console, err


@app.command("route")
def route_command(
    text: Annotated[str, typer.Argument(help="The task, as a user would write it.")],
    explain: Annotated[
        bool, typer.Option("--explain", help="Every agent's score, the threshold and margin.")
    ] = False,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            help="An agents.yaml (default: NANOCRAB_AGENTS, else <home>/agents.yaml).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the router's decision for TEXT by embedding similarity (docs/memory.md).

    Below the threshold or margin the runtime asks the model before falling back to the
    default agent; this command shows the embedding step only. Exit status 2: no or bad
    agents.yaml.
    """
    from nanocrab.cli.settings import default_home
    from nanocrab.memory import default_embedder
    from nanocrab.routing import AgentsError, Router, agents_file, load_agents

    path = file or agents_file(default_home(Path.cwd(), os.environ), os.environ)
    if path is None:
        err.print("no agents.yaml (NANOCRAB_AGENTS or <home>/agents.yaml): every task goes to "
                  "the default agent")  # fmt: skip
        raise typer.Exit(2)
    try:
        config = load_agents(path)
    except AgentsError as exc:
        err.print(f"[bold red]agents error:[/] {exc}", soft_wrap=True)
        raise typer.Exit(2) from exc
    decision = Router(config, default_embedder()).by_embedding(text)
    if as_json:
        print(json.dumps({
            "agent": decision.agent, "method": decision.method, "score": decision.score,
            "margin": decision.margin, "threshold": config.threshold,
            "min_margin": config.margin, "scores": decision.scores,
        }))  # fmt: skip
        return
    console.print(f"[bold]{decision.agent}[/] · {decision.method} · score {decision.score:.3f}"
                  f" · margin {decision.margin:.3f}")  # fmt: skip
    if explain:
        console.print(f"threshold {config.threshold} · margin {config.margin} · {path}")
        for name, score in decision.scores.items():
            console.print(f"  {name:<20} {score:.3f}")
        if decision.method == "fallback":
            console.print("below the threshold or margin: the runtime asks the model, else "
                          f"the default agent ({config.default})")  # fmt: skip
