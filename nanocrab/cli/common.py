"""What every command shares: the typer app, consoles, settings, error reporting."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Annotated, Any, TextIO, TypeVar

import typer
from rich.console import Console
from rich.logging import RichHandler

from nanocrab.bus import BusError
from nanocrab.bus.tracing import configure_tracing
from nanocrab.cli.settings import Settings
from nanocrab.events import EventError
from nanocrab.llm.base import LlmConfigError
from nanocrab.policy import PolicyError
from nanocrab.projections import ProjectionError
from nanocrab.security import SecurityError
from nanocrab.skills import SkillError

T = TypeVar("T")

app = typer.Typer(
    help="nanocrab: an event-sourced agent runtime on NATS JetStream.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
projections_app = typer.Typer(help="Read models built from the log.", no_args_is_help=True)
app.add_typer(projections_app, name="projections")
capabilities_app = typer.Typer(
    help="AI-generated capabilities: generate, list, show, enable, disable, remove, invoke.",
    no_args_is_help=True,
)
app.add_typer(capabilities_app, name="capabilities")

UNWRAPPED_WIDTH = 1000
"""Columns for output that is not a terminal: wide enough that rows are never squeezed."""


def make_console(*, stderr: bool = False, file: TextIO | None = None) -> Console:
    """A console as wide as the terminal; when the output is a file or a pipe (rich would assume
    80 columns and squeeze every table), :data:`UNWRAPPED_WIDTH` so tables and lines keep the
    width of their content. ``COLUMNS`` in the environment wins either way."""
    stream = file or (sys.stderr if stderr else sys.stdout)
    wide = not stream.isatty() and not os.environ.get("COLUMNS")
    return Console(stderr=stderr, file=file, width=UNWRAPPED_WIDTH if wide else None)


console = make_console()
err = make_console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON object per line, for machines.")]


def settings_or_exit() -> Settings:
    try:
        return Settings.from_env()
    except ValueError as exc:
        err.print(f"[bold red]configuration error:[/] {exc}")
        raise typer.Exit(2) from exc


def setup(settings: Settings, service: str) -> None:
    logging.basicConfig(
        level=logging.WARNING,
        handlers=[RichHandler(console=err, show_path=False)],
        format="%(message)s",
    )
    configure_tracing(
        service, exporter=settings.traces, console_path=settings.home / "traces.jsonl"
    )


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except BusError as exc:
        err.print(f"[bold red]bus error:[/] {exc}")
        raise typer.Exit(1) from exc
    except EventError as exc:
        err.print(f"[bold red]event refused:[/] {exc}")
        raise typer.Exit(1) from exc
    except (LlmConfigError, SkillError) as exc:
        err.print(f"[bold red]configuration error:[/] {exc}")
        raise typer.Exit(2) from exc
    except PolicyError as exc:
        err.print(f"[bold red]policy error:[/] {exc}")
        raise typer.Exit(2) from exc
    except SecurityError as exc:
        err.print(f"[bold red]security set-up error:[/] {exc}")
        raise typer.Exit(2) from exc
    except ProjectionError as exc:
        err.print(f"[bold red]projection error:[/] {exc}")
        raise typer.Exit(1) from exc
