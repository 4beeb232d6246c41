"""The ``nanocrab`` command line (typer + rich).

Importing a command module registers its commands on :data:`app`, in this order, which is the
order of ``nanocrab --help``. The command modules import only typer, rich's console and
:mod:`nanocrab.cli.common`; each command imports what it uses when it runs, so ``--help`` and
the commands that need no bus, database or policy stay fast (tests/test_cli_lazy.py)."""

from nanocrab.cli import approve as _approve  # noqa: F401  (approve, deny)
from nanocrab.cli import audit as _audit  # noqa: F401  (audit, approvals)
from nanocrab.cli import usage as _usage  # noqa: F401  (usage)

# isort: split
from nanocrab.cli import agent as _agent  # noqa: F401  (run, demo, rerun, cancel, say)
from nanocrab.cli import app as _app  # noqa: F401  (up, publish … projections)
from nanocrab.cli import branch as _branch  # noqa: F401  (branch)
from nanocrab.cli import capabilities as _capabilities  # noqa: F401
from nanocrab.cli import gateway as _gateway  # noqa: F401  (gateway, gateway token)
from nanocrab.cli import route as _route  # noqa: F401
from nanocrab.cli import security as _security  # noqa: F401
from nanocrab.cli.common import app
from nanocrab.cli.guardrails import guardrails_app

app.add_typer(guardrails_app, name="guardrails")
from nanocrab.cli import config as _config  # noqa: E402, F401  (config history … rollback)
from nanocrab.cli import connectors as _connectors  # noqa: E402, F401  (connectors list)
from nanocrab.cli import mcp as _mcp  # noqa: E402, F401  (mcp list)
from nanocrab.cli import skills as _skills  # noqa: E402, F401  (skills list, show, check)

# isort: split
from nanocrab.cli import cluster as _cluster  # noqa: E402, F401  (cluster up, down, keys …)
from nanocrab.cli import handler as _handler  # noqa: E402, F401  (handler NAME)


def main() -> None:
    app()


__all__ = ["app", "main"]
