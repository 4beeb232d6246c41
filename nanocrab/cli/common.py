"""What every command shares: the typer app, consoles, settings, error reporting.

Imported by ``nanocrab --help`` and by every command before it runs, so it imports only typer
and rich's console: the settings, the bus, tracing and the error types of each layer are
imported by the function that needs them (see tests/test_cli_lazy.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any, TextIO, TypeVar

import typer
from rich.console import Console

if TYPE_CHECKING:
    from nanocrab.cli.settings import Settings

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
    from nanocrab.cli.settings import Settings

    try:
        return Settings.from_env()
    except ValueError as exc:
        err.print(f"[bold red]configuration error:[/] {exc}")
        raise typer.Exit(2) from exc


def setup(settings: Settings, service: str) -> None:
    import logging

    from rich.logging import RichHandler

    from nanocrab.bus.tracing import configure_tracing

    logging.basicConfig(
        level=logging.WARNING,
        handlers=[RichHandler(console=err, show_path=False)],
        format="%(message)s",
    )
    configure_tracing(
        service, exporter=settings.traces, console_path=settings.home / "traces.jsonl"
    )


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; a refusal of one of nanocrab's layers (bus, event, configuration, policy,
    security set-up, projection) is printed as one line and exits 1 or 2, anything else
    propagates."""
    import asyncio

    try:
        return asyncio.run(coro)
    except Exception as exc:
        known = _refusal(exc)
        if known is None:
            raise
        label, code = known
        err.print(f"[bold red]{label}:[/] {exc}")
        raise typer.Exit(code) from exc


async def until_signalled(work: Awaitable[T]) -> T | None:
    """Await ``work`` until it ends or SIGINT/SIGTERM arrives; a signal ends it quietly (``None``).

    For commands that follow until Ctrl-C. Unlike relying on ``KeyboardInterrupt`` this also
    works when the process started with SIGINT ignored (a background job of a script), and the
    caller's ``async with`` blocks still close the bus and stop the embedded server."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    signalled = False

    def stop() -> None:
        nonlocal signalled
        signalled = True
        task.cancel()

    sigs = (signal.SIGINT, signal.SIGTERM)
    for sig in sigs:
        loop.add_signal_handler(sig, stop)
    try:
        return await task
    except asyncio.CancelledError:
        if signalled:
            return None
        raise
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


def _refusal(exc: Exception) -> tuple[str, int] | None:
    """How :func:`run_async` reports ``exc``: a label and an exit code, or ``None`` for an
    exception it does not know. The error types are imported here, on the failure path, so a
    command imports only the layers it uses (each of them is already loaded when it raised)."""
    from nanocrab.bus import BusError
    from nanocrab.events import EventError
    from nanocrab.llm.base import LlmConfigError
    from nanocrab.policy import PolicyError
    from nanocrab.projections import ProjectionError
    from nanocrab.security import SecurityError
    from nanocrab.skills import SkillError

    kinds: list[tuple[type[Exception] | tuple[type[Exception], ...], str, int]] = [
        (BusError, "bus error", 1),
        (EventError, "event refused", 1),
        ((LlmConfigError, SkillError), "configuration error", 2),
        (PolicyError, "policy error", 2),
        (SecurityError, "security set-up error", 2),
        (ProjectionError, "projection error", 1),
    ]
    for kind, label, code in kinds:
        if isinstance(exc, kind):
            return label, code
    if type(exc).__name__ in CONFIG_ERRORS:
        return "configuration error", 2
    return None


CONFIG_ERRORS = frozenset({
    "AgentsError", "GuardrailsError", "McpConfigError", "ConnectorConfigError",
    "CapabilityConfigError", "HookConfigError", "CredentialError",
})  # fmt: skip
"""The configuration files' errors (agents.yaml, guardrails.yaml, mcp.yaml, connectors.yaml,
capabilities.yaml, hooks.yaml, credentials): each message names file and line; matched by name
so that reporting one does not import every layer that defines them."""
