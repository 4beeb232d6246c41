"""``nanocrab capabilities`` as a user runs it: a fresh data directory, no API key, the offline
model, the real sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli import cli


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.mark.timeout(600)  # the command's own limit below is 180 s; the suite's default 120 s
def test_generate_offline_then_list_show_invoke_disable(home: Path) -> None:
    generated = cli(home, "capabilities", "generate", "count words in a text", timeout=180)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    out = generated.stdout
    assert "attempt 1" in out and "refused" in out and "[dynamic_code]" in out, out
    assert "attempt 2" in out and "tests 3/3 passed" in out
    assert "registered word_count 0.1.0" in out and "safety level safe" in out
    assert "nanocrab capabilities enable word_count" in out
    assert "Traceback" not in generated.stderr

    listed = cli(home, "capabilities", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (row["name"], row["version"], row["status"], row["safety_level"]) == (
        "word_count", "0.1.0", "disabled", "safe",
    )  # fmt: skip
    assert len(row["content_hash"]) == 64 and f"sha256 {row['content_hash'][:12]}" in out

    # registered is not allowed: the user decides (seed 001)
    waiting = cli(home, "capabilities", "invoke", "word_count", "--args", '{"text":"a b"}')
    assert waiting.returncode == 1 and "not enabled yet" in waiting.stderr
    assert "capabilities enable word_count" in waiting.stderr
    assert cli(home, "capabilities", "enable", "word_count").returncode == 0

    invoked = cli(home, "capabilities", "invoke", "word_count", "--args", '{"text":"a b"}')
    assert invoked.returncode == 0, invoked.stderr
    assert '{"words": 2, "unique": 2, "top": [["a", 1], ["b", 1]]}' in invoked.stdout

    as_json = cli(home, "capabilities", "invoke", "word_count", "--args", '{"text":"x"}', "--json")
    assert as_json.returncode == 0, as_json.stderr
    result = json.loads(as_json.stdout)
    assert result["ok"] and result["value"]["words"] == 1 and result["outcome"] == "ok"

    invalid = cli(home, "capabilities", "invoke", "word_count", "--args", '{"txt":"a b"}')
    assert invalid.returncode == 2
    assert "'text' is a required property" in invalid.stderr
    assert "text (string, required)" in invalid.stderr

    not_json = cli(home, "capabilities", "invoke", "word_count", "--args", "{text")
    assert not_json.returncode == 2 and "not valid JSON" in not_json.stderr

    shown = cli(home, "capabilities", "show", "word_count", "--json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert [v["version"] for v in detail["versions"]] == ["0.1.0"]
    assert detail["versions"][0]["attempts"] == 2
    assert detail["stats"]["count"] == 2 and detail["stats"]["success_rate"] == 1.0
    assert detail["stats"]["p95_ms"] > 0 and "def word_count(" in detail["code"]
    pretty = cli(home, "capabilities", "show", "word_count")
    assert pretty.returncode == 0 and "p95" in pretty.stdout and "def word_count" in pretty.stdout

    disabled = cli(home, "capabilities", "disable", "word_count", "--reason", "under review")
    assert disabled.returncode == 0, disabled.stderr
    refused = cli(home, "capabilities", "invoke", "word_count", "--args", '{"text":"a b"}')
    assert refused.returncode == 1
    assert "word_count is disabled (under review): not invoked" in refused.stderr
    assert "capabilities enable word_count" in refused.stderr

    assert cli(home, "capabilities", "enable", "word_count").returncode == 0
    again = cli(home, "capabilities", "invoke", "word_count", "--args", '{"text":"a b"}')
    assert again.returncode == 0, again.stderr

    removed = cli(home, "capabilities", "remove", "word_count")
    assert removed.returncode == 0, removed.stderr
    assert "no capabilities yet" in cli(home, "capabilities", "list").stdout
    gone = cli(home, "capabilities", "invoke", "word_count", "--args", '{"text":"a b"}')
    assert gone.returncode == 1 and "word_count is removed" in gone.stderr

    unknown = cli(home, "capabilities", "show", "nope")
    assert unknown.returncode == 1 and "no capability 'nope'" in unknown.stderr


def test_generate_that_no_offline_script_knows_fails_with_advice(home: Path) -> None:
    result = cli(home, "capabilities", "generate", "translate Klingon poetry", "--attempts", "1")
    assert result.returncode == 1
    assert "nothing registered" in result.stderr and "no model script matches" in result.stderr
    assert "Traceback" not in result.stderr
