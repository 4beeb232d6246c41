"""The ``nanocrab`` command line (typer + rich)."""

from nanocrab.cli import agent as _agent  # noqa: F401  (registers the agent commands)
from nanocrab.cli.app import app


def main() -> None:
    app()


__all__ = ["app", "main"]
