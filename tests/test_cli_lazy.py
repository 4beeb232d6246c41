"""Every command imports what it uses when it runs: declaring the commands (what ``nanocrab
--help`` and every command import first) loads no database, bus, policy, model or sandbox
library. Structural, not timed: each check is a fresh interpreter's ``sys.modules``.

bench/cli_startup.py measures what this buys."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import typer

from nanocrab.cli.common import run_async

HEAVY = (
    "sqlalchemy", "bashlex", "nats", "anthropic", "wasmtime", "opentelemetry", "jsonschema",
    "nanocrab.bus", "nanocrab.events", "nanocrab.projections", "nanocrab.policy",
    "nanocrab.handlers", "nanocrab.llm", "nanocrab.sandbox", "fastapi", "uvicorn", "starlette",
    "limits", "jinja2", "telegram",
)  # fmt: skip


def loaded_after(code: str) -> list[str]:
    """The :data:`HEAVY` modules a fresh interpreter has loaded after running ``code``."""
    probe = textwrap.dedent(code) + textwrap.dedent(
        f"""
        import json, sys
        print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_importing_the_cli_loads_no_heavy_library() -> None:
    assert loaded_after("import nanocrab.cli.app") == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["audit", "--help"],
        ["usage", "--help"],
        ["capabilities", "invoke", "--help"],
        ["security", "observer", "--help"],
        ["projections", "rebuild", "--help"],
        ["gateway", "--help"],
        ["gateway", "token", "create", "--help"],
        ["config", "history", "--help"],
        ["skills", "check", "--help"],
        ["handler", "--help"],
        ["cluster", "up", "--help"],
        ["connectors", "list", "--help"],
        ["branch", "--help"],
    ],
)
def test_help_loads_no_heavy_library(argv: list[str]) -> None:
    code = f"""
        import contextlib, io
        from nanocrab.cli import app
        with contextlib.redirect_stdout(io.StringIO()) as out:
            app({argv!r}, standalone_mode=False)
        assert "Usage" in out.getvalue(), out.getvalue()
        """
    assert loaded_after(code) == []


def test_commands_are_listed_in_their_order() -> None:
    """The order of ``nanocrab --help`` follows the imports in ``nanocrab/cli/__init__.py``."""
    from nanocrab.cli import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    assert list(group.commands) == [
        "approve", "deny", "audit", "approvals", "usage", "run", "demo", "rerun", "cancel", "say", "up",
        "publish", "tail", "replay", "status", "dead-letters", "branch", "route", "handler",
        "projections", "capabilities", "gateway", "security", "guardrails", "config", "connectors",
        "mcp", "skills",
        "cluster",
    ]  # fmt: skip


def test_audit_statuses_are_the_projections() -> None:
    from nanocrab.cli.audit import STATUSES
    from nanocrab.projections.audit import STATUSES as PROJECTED

    assert STATUSES == PROJECTED


def test_the_policy_imports_bashlex_at_its_first_shell_parse() -> None:
    code = """
        import sys
        from nanocrab.policy.matchers import Refused
        from nanocrab.policy.shell import parse_command
        assert "bashlex" not in sys.modules
        assert len(parse_command("ls -la && echo hi", "/tmp").segments) == 2
        try:  # bashlex's own parse error is still a refusal
            parse_command("echo (", "/tmp")
        except Refused as exc:
            assert "could not be parsed" in str(exc), exc
        else:
            raise AssertionError("not refused")
        """
    assert "bashlex" in loaded_after(code)


def test_run_async_reports_a_layers_refusal_and_propagates_the_rest() -> None:
    from nanocrab.bus import BusError
    from nanocrab.policy import PolicyError

    async def fail(exc: Exception) -> None:
        raise exc

    with pytest.raises(typer.Exit) as bus:
        run_async(fail(BusError("no server")))
    assert bus.value.exit_code == 1
    with pytest.raises(typer.Exit) as policy:
        run_async(fail(PolicyError("bad rule")))
    assert policy.value.exit_code == 2
    with pytest.raises(ValueError, match="other"):
        run_async(fail(ValueError("other")))
