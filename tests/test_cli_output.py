"""What the CLI writes when nobody is watching a terminal: unsqueezed tables, checked
``tail --type`` patterns, and ``traces.jsonl`` as JSON Lines."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from rich.table import Table
from typer.testing import CliRunner

from nanocrab.bus.tracing import json_lines_exporter
from nanocrab.cli.common import make_console
from nanocrab.cli.patterns import type_pattern_error


def test_a_table_piped_to_a_file_keeps_its_content_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    table = Table()
    for column in ("approval id", "run", "tool", "arguments", "reason"):
        table.add_column(column)
    arguments = "command='pytest -q tests/test_a_rather_long_module_name.py -k something'"
    table.add_row("01JWTH3J8RC6MZ1TFE2X0N4Q7B", "VAZ22JWF", "shell", arguments, "Guarded")
    make_console(file=out).print(table)
    lines = out.getvalue().splitlines()
    assert len(lines) == 5, "header, rules and one row: no cell wrapped"
    assert any(arguments in line for line in lines)
    monkeypatch.setenv("COLUMNS", "60")
    narrow = io.StringIO()
    make_console(file=narrow).print(table)
    assert max(len(line) for line in narrow.getvalue().splitlines()) <= 60, "COLUMNS wins"


@pytest.mark.parametrize("pattern", ["tool", "run.*", "llm.responded", "*.completed", "*", ">"])
def test_known_type_patterns_pass(pattern: str) -> None:
    assert type_pattern_error(pattern) is None


@pytest.mark.parametrize(
    ("pattern", "suggested"),
    [("tol", "'tool'"), ("tool.complted", "'tool.completed'"), ("run.finished", None)],
)
def test_a_pattern_no_type_matches_is_refused_with_a_suggestion(
    pattern: str, suggested: str | None
) -> None:
    error = type_pattern_error(pattern)
    assert error is not None and f"no event type matches {pattern!r}" in error
    assert "Families: agent, alert, approval," in error
    if suggested:
        assert f"did you mean {suggested}" in error


def test_tail_exits_2_on_an_unknown_type_before_connecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nanocrab.cli import app

    monkeypatch.setenv("NANOCRAB_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["tail", "--type", "tool.complted"])
    assert result.exit_code == 2 and "did you mean 'tool.completed'" in result.output


def test_spans_are_written_as_json_lines() -> None:
    out = io.StringIO()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(json_lines_exporter(out)))
    tracer = provider.get_tracer("test")
    with (
        tracer.start_as_current_span("outer", attributes={"note": "two\nlines"}),
        tracer.start_as_current_span("inner"),
    ):
        pass
    provider.shutdown()
    lines = out.getvalue().splitlines()
    spans = [json.loads(line) for line in lines]
    assert [s["name"] for s in spans] == ["inner", "outer"]
    assert spans[1]["attributes"]["note"] == "two\nlines"
    assert spans[0]["parent_id"] == spans[1]["context"]["span_id"]


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("agents.yaml", "agents:\n  - name: x\n    bogus: 1\n", "agents.yaml:2"),
        ("capabilities.yaml", "version: 1\ncapability_config:\n  bogus: 1\n",
         "capabilities.yaml:3"),
        ("guardrails.yaml", "version: 1\nfilters: [{id: a, detector: nope}]\n",
         "guardrails.yaml:2"),
    ],
)  # fmt: skip
def test_a_broken_configuration_file_is_one_line_with_file_and_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str, where: str
) -> None:
    """Not a traceback: what is wrong, where, and exit code 2 (before anything starts)."""
    from nanocrab.cli.app import app

    (tmp_path / name).write_text(text)
    monkeypatch.setenv("NANOCRAB_HOME", str(tmp_path))
    monkeypatch.delenv("NANOCRAB_CONFIG_DIR", raising=False)
    result = CliRunner().invoke(app, ["run", "hello", "--workspace", str(tmp_path)])
    assert result.exit_code == 2, result.output
    flat = result.output.replace("\n", "")  # a console narrower than the temporary path wraps it
    assert flat.startswith("configuration error:") and where in flat
    assert "Traceback" not in result.output
