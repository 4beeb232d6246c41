"""The ``nanocrab`` command line (typer + rich)."""

from nanocrab.cli.app import app


def main() -> None:
    app()


__all__ = ["app", "main"]
