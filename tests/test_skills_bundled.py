"""The skills shipped in the repository's ``skills/`` directory load cleanly and their scripts run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanocrab.skills import SkillLibrary, bundled_skills_dir

EXPECTED = {"code-review", "commit-message", "log-triage", "python-debugging"}
SCRIPT = bundled_skills_dir() / "log-triage" / "scripts" / "errors_by_minute.py"
PYTHON3 = shutil.which("python3") or sys.executable

SAMPLE_LOG = """\
2024-05-01T12:00:01Z INFO server started on port 8080
2024-05-01T12:00:30Z INFO GET /health 200 2ms
2024-05-01T12:01:02Z WARN db pool 9/10 connections in use
2024-05-01T12:01:05Z ERROR request 8f3a2c1d9e failed: timeout after 30.0s talking to db-1
2024-05-01T12:01:09Z ERROR request 77aa00bb11 failed: timeout after 12.5s talking to db-1
Traceback (most recent call last):
  File "app.py", line 10, in handler
TimeoutError: db-1
2024-05-01T12:04:00Z {"level": "error", "msg": "disk full on /var/lib/app"}
2024-05-01T12:04:10Z level=info msg="recovered"
"""


@pytest.fixture(scope="module")
def library() -> SkillLibrary:
    return SkillLibrary.discover([bundled_skills_dir()])


def test_every_bundled_skill_loads_without_problems(library: SkillLibrary) -> None:
    assert library.problems == ()
    assert set(library.names()) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_bundled_skill_has_a_substantial_body_and_a_trigger(
    library: SkillLibrary, name: str
) -> None:
    skill = library.get(name)
    assert skill is not None
    assert "Use when" in skill.description
    lines = library.body(name).splitlines()
    assert 60 <= len(lines) <= 200, f"{name}: {len(lines)} body lines"
    assert lines[0].startswith("# ")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_resources_named_in_a_body_exist(library: SkillLibrary, name: str) -> None:
    mentioned = set(re.findall(r"\b(?:scripts|references|assets)/[\w.-]+\.\w+", library.body(name)))
    assert mentioned <= set(library.resources(name))
    for relpath in mentioned:
        assert library.resource(name, relpath)


def test_the_bundled_resources(library: SkillLibrary) -> None:
    assert library.resources("code-review") == ["references/checklist.md"]
    assert library.resources("log-triage") == ["scripts/errors_by_minute.py"]


def run_script(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON3, str(SCRIPT), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_errors_by_minute_counts_errors_per_minute_and_marks_gaps(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    log.write_text(SAMPLE_LOG, encoding="utf-8")

    done = run_script(str(log), "--top", "0")

    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert rows[0] == ["minute", "errors", "lines"]
    assert rows[1] == ["2024-05-01", "12:00", "0", "2"]
    assert rows[2][:4] == ["2024-05-01", "12:01", "2", "6"]
    assert rows[3] == ["...", "no", "lines", "for", "2", "min"]
    assert rows[4][:4] == ["2024-05-01", "12:04", "1", "2"]
    assert done.stdout.splitlines()[5] == "total: 3 error lines in 10 lines"
    assert "signatures" not in done.stdout


def test_errors_by_minute_groups_signatures_and_reads_stdin() -> None:
    done = run_script("--top", "2", stdin=SAMPLE_LOG)

    assert done.returncode == 0, done.stderr
    top = done.stdout.split("signatures (count, first minute, signature):\n")[1].splitlines()
    assert top[0].split(None, 3) == [
        "2",
        "2024-05-01",
        "12:01",
        "ERROR request <hex> failed: timeout after <n>s talking to db-<n>",
    ]
    assert top[1].split(None, 3)[:3] == ["1", "2024-05-01", "12:04"]
    assert len(top) == 2


def test_errors_by_minute_handles_syslog_times_and_custom_patterns() -> None:
    sample = "May  1 12:03:04 web nginx: GET / 502\nMay  1 12:03:40 web nginx: GET / 200\n"

    done = run_script("--pattern", r" 5\d\d$", "--top", "0", stdin=sample)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[:5] == ["May", "01", "12:03", "1", "2"]


def test_errors_by_minute_reports_a_bad_pattern_or_missing_file(tmp_path: Path) -> None:
    bad_pattern = run_script("--pattern", "(", stdin="")
    missing = run_script(str(tmp_path / "missing.log"))

    assert bad_pattern.returncode == 2
    assert "not a valid regex" in bad_pattern.stderr
    assert missing.returncode == 2
    assert "missing.log" in missing.stderr
