"""The ``nanocrab`` command line (typer + rich)."""

from nanocrab.cli import agent as _agent  # noqa: F401  (registers the agent commands)
from nanocrab.cli import app as _app  # noqa: F401  (registers the run, events … commands)
from nanocrab.cli import approve as _approve  # noqa: F401
from nanocrab.cli import audit as _audit  # noqa: F401
from nanocrab.cli import capabilities as _capabilities  # noqa: F401
from nanocrab.cli import security as _security  # noqa: F401
from nanocrab.cli.common import app


def main() -> None:
    app()


__all__ = ["app", "main"]
