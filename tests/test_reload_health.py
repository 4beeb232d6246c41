"""The health watch cannot be steered by whoever submits tasks: only failures a configuration
can cause count, a version changing what runs may do is never rolled back automatically, and a
rolled-back version does not come straight back from the unchanged directory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import Delivery, EventLog, read
from nanocrab.events import (
    AlertRaised,
    GrantDenied,
    ReloadActivated,
    ReloadRolledBack,
    RunFailed,
    RunStarted,
    new_event_id,
)
from nanocrab.handlers.reloader import Reloader
from nanocrab.reload import ConfigView, HealthOptions
from nanocrab.security import KeyRing

from . import test_reload
from .agent_fixtures import finished, of_type, running_host, submit
from .conftest import eventually
from .reload_rig import (
    NO_READ_POLICY_YAML,
    OPEN_POLICY_YAML,
    Model,
    make_view,
    next_reload,
    reload_reactors,
    skill_md,
    write_config,
)
from .test_reload import _is, activated

engine = test_reload.engine  # the reload tests' fixtures
workspace = test_reload.workspace

HEALTH = HealthOptions(threshold=0.5, min_runs=2)


@contextlib.asynccontextmanager
async def watched(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path, config: Path,
    health: HealthOptions | None = HEALTH,
) -> AsyncIterator[tuple[ConfigView, Reloader, ReloadActivated]]:
    """The loop and a reloader on ``config`` (written already), its first version active."""
    view = make_view(log, tmp_path / "cache")
    reactors, reloader = reload_reactors(
        log, engine, Model(), workspace, view=view, config_dir=config,
        keys=KeyRing(tmp_path / "k"), health=health,
    )  # fmt: skip
    async with running_host(log, engine, reactors):
        await asyncio.wait_for(reloader.watching.wait(), 10)
        first = await reloader.propose_now(force=True)
        assert first is not None
        active = await next_reload(log, activated(first.version))
        assert isinstance(active, ReloadActivated)
        yield view, reloader, active


async def fail_two_runs(log: EventLog, workspace: Path) -> None:
    """Two tasks on the active version, each failed by the model (the poison skill)."""
    failing = [submit(f"say hi {i}", workspace) for i in range(2)]
    for t in failing:
        await log.append(t)
    for t in failing:
        assert of_type(await finished(log, t.run_id or ""), RunFailed)


async def _alerts(log: EventLog) -> list[AlertRaised]:
    return [
        s.event async for s in read(log, log.subjects.of_type("alert.raised"))
        if isinstance(s.event, AlertRaised) and s.event.origin == "reload"
    ]  # fmt: skip


async def _rollbacks(log: EventLog) -> list[ReloadRolledBack]:
    return [
        s.event async for s in read(log, log.subjects.of_type("reload.rolled_back"))
        if isinstance(s.event, ReloadRolledBack)
    ]  # fmt: skip


async def test_runs_a_submitter_makes_fail_do_not_count_against_a_version(
    log: EventLog, tmp_path: Path
) -> None:
    """Blocked by a guardrail, over a budget, refused: outcomes the submitter chooses. Three of
    them on a watched version are three runs, no failure; a tool's failure counts."""
    reloader = Reloader(log, view=make_view(log, tmp_path / "cache"), config_dir=tmp_path / "c",
                        health=HEALTH, watch=False)  # fmt: skip
    at = Delivery(seq=1, subject="-")
    await reloader.handle(ReloadActivated(version="v2", previous="", reason="change"), at)

    async def run(kind: str) -> object:
        run_id = new_event_id()
        await reloader.handle(RunStarted(run_id=run_id, agent="default", config="v2"), at)
        return await reloader.handle(RunFailed(run_id=run_id, kind=kind, reason="-"), at)

    for kind in ("guardrail", "budget", "rejected"):
        assert not (await run(kind)).events  # type: ignore[attr-defined]
    watched = reloader.health.watched
    assert watched is not None and (watched.runs, watched.failed) == (3, 0)
    await run("tool")
    assert (watched.runs, watched.failed) == (4, 1)


async def test_a_failing_policy_tightening_raises_an_alert_and_stays_active(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    """Runs on a version that changes policy.yaml fail past the threshold: going back would
    allow what it forbids, so the reloader alerts and a person decides; the tightening holds."""
    config = tmp_path / "config"
    write_config(config)
    async with watched(log, engine, workspace, tmp_path, config) as (view, reloader, first):
        # tighter, and (a skill the model chokes on) every run on it fails
        write_config(config, policy=NO_READ_POLICY_YAML,
                     bad=skill_md("bad", "A poison pill.", "Nothing."))  # fmt: skip
        strict = await next_reload(
            log, lambda e: isinstance(e, ReloadActivated) and e.version != first.version
        )
        await eventually(lambda: _is(view.active, strict.version))
        await fail_two_runs(log, workspace)
        alerts = await eventually(lambda: _alerts(log))
        assert await reloader.propose_now() is None  # the directory is the active version

        (config / "skills" / "bad").joinpath("SKILL.md").unlink()
        (config / "skills" / "bad").rmdir()
        fixed = await next_reload(
            log, lambda e: isinstance(e, ReloadActivated) and e.version not in
            (first.version, strict.version),
        )  # fmt: skip
        await eventually(lambda: _is(view.active, fixed.version))
        after = submit("call read path=notes.txt", workspace)
        await log.append(after)
        denied = await finished(log, after.run_id or "")

    assert len(alerts) == 1 and alerts[0].severity == "critical"
    assert "not rolled back automatically" in alerts[0].summary
    assert "policy.yaml" in alerts[0].summary
    assert not await _rollbacks(log)
    assert [d.tool for d in of_type(denied, GrantDenied)] == ["read"]


async def test_a_rolled_back_version_is_not_proposed_again_from_the_unchanged_directory(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    """The directory still holds the bad version after the automatic rollback: proposing it
    again would undo the rollback (it used to, once the server's duplicate window of the
    first proposal's id had passed). Activating it by hand still works."""
    config = tmp_path / "config"
    write_config(config, greet=skill_md("greet", "Greets.", "Say HELLO."))
    async with watched(log, engine, workspace, tmp_path, config) as (view, reloader, good):
        write_config(config, bad=skill_md("bad", "A poison pill.", "Nothing."))
        bad = await next_reload(
            log, lambda e: isinstance(e, ReloadActivated) and e.version != good.version
        )
        await eventually(lambda: _is(view.active, bad.version))
        await fail_two_runs(log, workspace)
        back = await next_reload(log, lambda e: isinstance(e, ReloadRolledBack))
        assert isinstance(back, ReloadRolledBack) and back.from_version == bad.version
        await eventually(lambda: _is(view.active, good.version))

        assert await reloader.propose_now() is None
        assert await reloader.propose_now(force=True) is not None  # a person's choice


async def test_a_change_made_again_after_a_switch_is_proposed_again(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    """Edit, undo the edit, make it again, all within the server's duplicate window: the
    third save is a new proposal, not a duplicate of the first (ids derive from the last
    switch too)."""
    config = tmp_path / "config"
    write_config(config)
    async with watched(log, engine, workspace, tmp_path, config, None) as (view, reloader, first):
        versions = [first.version]
        for text in (NO_READ_POLICY_YAML, OPEN_POLICY_YAML, NO_READ_POLICY_YAML):
            (config / "policy.yaml").write_text(text)
            proposed = await reloader.propose_now()
            assert proposed is not None
            switched = await next_reload(
                log, lambda e, p=proposed: isinstance(e, ReloadActivated)  # type: ignore[misc]
                and e.version == p.version and e.previous == versions[-1],
            )  # fmt: skip
            versions.append(switched.version)
            await eventually(lambda v=switched.version: _is(view.active, v))  # type: ignore[misc]

    assert versions[1] == versions[3] != versions[2] == versions[0]


@pytest.mark.parametrize("kind", ["guardrail", "budget", "rejected"])
def test_submitter_failures_are_named(kind: str) -> None:
    from nanocrab.reload.health import counts_against, touches_permissions

    assert not counts_against(kind)
    assert counts_against("tool") and counts_against("llm")
    assert touches_permissions(["skills/x/SKILL.md", "policy.yaml"]) == ["policy.yaml"]
