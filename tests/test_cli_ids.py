"""Short ids: a unique prefix or suffix of a run or approval id names it everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from nanocrab.bus import EventLog
from nanocrab.cli.ids import IdError, resolve_id, resolve_run, run_ids
from nanocrab.events import TaskSubmitted, new_event_id

RUNS = ["01JWTH3J8R02R73A72VAZ22JWF", "01JWTH3J8R02R73A72VAZ99ABC", "01JX0000000000000000000XYZ"]


def test_a_whole_id_a_unique_prefix_or_a_unique_suffix_names_one_run() -> None:
    assert resolve_id(RUNS[0], RUNS) == RUNS[0]
    assert resolve_id("01JX", RUNS) == RUNS[2], "unique prefix"
    assert resolve_id("AZ22JWF", RUNS) == RUNS[0], "unique suffix, as tail shows it"
    assert resolve_id("az99abc", RUNS) == RUNS[1], "case does not matter"
    assert resolve_id("ab", ["ab", "abc"]) == "ab", "a whole id wins even when short"


@pytest.mark.parametrize(
    ("given", "kind", "says"),
    [
        ("01JWTH3J", "ambiguous", f"matches {RUNS[0]}, {RUNS[1]}"),
        ("NOPE1234", "unknown", "no run 'NOPE1234'"),
        ("JWF", "short", "at least 4 characters"),
    ],
)
def test_an_ambiguous_unknown_or_too_short_id_says_why(given: str, kind: str, says: str) -> None:
    with pytest.raises(IdError) as refused:
        resolve_id(given, RUNS)
    assert refused.value.kind == kind and says in str(refused.value)
    if kind == "ambiguous":
        assert refused.value.candidates == (RUNS[0], RUNS[1])


async def test_run_ids_come_from_the_log_and_resolve(log: EventLog) -> None:
    mine = [new_event_id() for _ in range(2)]
    for run in mine:
        await log.append(TaskSubmitted(text="short ids", run_id=run, task_id=run))
    known = await run_ids(log)
    assert set(mine) <= set(known)
    assert await resolve_run(log, mine[0][-10:].lower()) == mine[0]
    assert await resolve_run(log, mine[1]) == mine[1]
    with pytest.raises(typer.Exit):
        await resolve_run(log, "ZZZZZZZZ-not-a-run")
    later = new_event_id()
    assert await resolve_run(log, later, missing_ok=True) == later, "tail may wait for it"
    with pytest.raises(typer.Exit):
        await resolve_run(log, mine[0][:4], missing_ok=True)  # ambiguous or too short: refused


def test_replay_cancel_and_say_take_the_short_id_tail_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nanocrab.cli import app

    monkeypatch.setenv("NANOCRAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NANOCRAB_NATS_URL", raising=False)
    monkeypatch.delenv("NANOCRAB_NATS_AUTH", raising=False)
    runner = CliRunner()
    published = runner.invoke(app, ["publish", "waiting for a handler", "--json"])
    assert published.exit_code == 0, published.output
    run_id = json.loads(published.stdout)["run_id"]
    replayed = runner.invoke(app, ["replay", run_id[-8:], "--json"])
    assert replayed.exit_code == 0, replayed.output
    assert {json.loads(line)["runid"] for line in replayed.stdout.splitlines()} == {run_id}
    said = runner.invoke(app, ["say", run_id[-8:], "hello"])
    assert said.exit_code == 0 and f"message for run {run_id}" in said.stdout, said.output
    short = runner.invoke(app, ["cancel", run_id[-3:]])
    assert short.exit_code == 1 and "too short" in short.output
    cancelled = runner.invoke(app, ["cancel", run_id[:20]])
    assert cancelled.exit_code == 0 and f"cancelled run {run_id}" in cancelled.stdout
