"""Hot reload end to end: real nats-server, the real loop, a reloader watching a directory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog, read
from nanocrab.events import (
    AlertRaised,
    GrantDenied,
    GrantIssued,
    ReloadActivated,
    ReloadProposed,
    ReloadRejected,
    ReloadRolledBack,
    RunFailed,
    RunStarted,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
)
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.reload import HealthOptions
from nanocrab.security import KeyRing

from .agent_fixtures import finished, of_type, running_host, submit
from .conftest import eventually
from .reload_rig import (
    NO_READ_POLICY_YAML,
    Model,
    make_view,
    next_reload,
    reload_reactors,
    skill_md,
    write_config,
)


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n")
    return ws


def activated(version: str | None = None):  # type: ignore[no-untyped-def]
    return lambda e: isinstance(e, ReloadActivated) and (version is None or e.version == version)


def skill_text(events: list) -> str:  # type: ignore[type-arg]
    done = [e for e in of_type(events, ToolCompleted) if e.tool == "skill"]
    assert done, "the skill tool did not run"
    return "".join(b.text for b in done[0].content if isinstance(b, TextBlock))


async def test_a_skill_edit_reaches_the_next_run_and_a_run_in_flight_keeps_its_version(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    write_config(config, greet=skill_md("greet", "Greets the first way.", "Say HELLO-ONE."))
    view = make_view(log, tmp_path / "cache")
    model = Model()
    reactors, reloader = reload_reactors(
        log, engine, model, workspace, view=view, config_dir=config, keys=KeyRing(tmp_path / "k")
    )
    async with running_host(log, engine, reactors):
        await asyncio.wait_for(reloader.watching.wait(), 10)
        first = await reloader.propose_now(force=True)
        assert first is not None
        v1 = await next_reload(log, activated(first.version))
        await eventually(lambda: _is(view.active, v1.version))

        held = submit("call skill name=greet hold", workspace)
        await log.append(held)
        await asyncio.wait_for(model.holding.wait(), 10)  # started, pinned, in its first turn

        (config / "skills" / "greet" / "SKILL.md").write_text(
            skill_md("greet", "Greets the second way.", "Say HELLO-TWO.")
        )  # the watcher sees the save
        v2 = await next_reload(log, lambda e: isinstance(e, ReloadActivated)
                               and e.version != v1.version)  # fmt: skip
        proposed = await next_reload(
            log, lambda e: isinstance(e, ReloadProposed) and e.version == v2.version
        )
        assert isinstance(proposed, ReloadProposed)
        assert proposed.changed == ["skills/greet/SKILL.md"]
        assert "+Say HELLO-TWO." in proposed.diff and "-Say HELLO-ONE." in proposed.diff
        await eventually(lambda: _is(view.active, v2.version))

        after = submit("call skill name=greet", workspace)
        await log.append(after)
        late = await finished(log, after.run_id or "")
        model.release.set()
        early = await finished(log, held.run_id or "")

    assert of_type(early, RunStarted)[0].config == v1.version
    assert of_type(late, RunStarted)[0].config == v2.version
    assert "HELLO-ONE" in skill_text(early) and "HELLO-TWO" not in skill_text(early)
    assert "HELLO-TWO" in skill_text(late)
    # the skills catalogue of each run's prompt is its own version's
    assert "Greets the first way." in model.systems[held.run_id or ""][0]
    assert "Greets the second way." in model.systems[after.run_id or ""][0]


async def _is(a: object, b: object) -> bool:
    return a == b


async def test_a_policy_change_narrows_what_the_next_call_may_do(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    write_config(config)
    view = make_view(log, tmp_path / "cache")
    reactors, reloader = reload_reactors(
        log, engine, Model(), workspace, view=view, config_dir=config,
        keys=KeyRing(tmp_path / "k"),
    )  # fmt: skip
    async with running_host(log, engine, reactors):
        await asyncio.wait_for(reloader.watching.wait(), 10)
        first = await reloader.propose_now(force=True)
        assert first is not None
        await next_reload(log, activated(first.version))
        before = submit("call read path=notes.txt", workspace)
        await log.append(before)
        allowed = await finished(log, before.run_id or "")

        (config / "policy.yaml").write_text(NO_READ_POLICY_YAML)
        narrowed = await next_reload(
            log, lambda e: isinstance(e, ReloadActivated) and e.version != first.version
        )
        await eventually(lambda: _is(view.active, narrowed.version))
        after = submit("call read path=notes.txt", workspace)
        await log.append(after)
        denied = await finished(log, after.run_id or "")

    assert [g.tool for g in of_type(allowed, GrantIssued)] == ["read"]
    assert not of_type(denied, GrantIssued)
    assert [d.tool for d in of_type(denied, GrantDenied)] == ["read"]


@pytest.mark.parametrize(
    ("path", "text", "line"),
    [
        ("policy.yaml", "version: 1\nrules:\n  - id: x\n    tools: [read\n", 5),
        ("policy.yaml", "version: 1\nrules:\n  - id: x\n    tools: [read]\n    tier: maybe\n", 5),
        ("skills/greet/SKILL.md", "---\nname: greet\ndescription: [oops\n---\nbody\n", 4),
    ],
)
async def test_a_broken_file_is_rejected_with_file_and_line_and_nothing_switches(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path,
    path: str, text: str, line: int,
) -> None:  # fmt: skip
    config = tmp_path / "config"
    write_config(config, greet=skill_md("greet", "Greets.", "Say HELLO."))
    view = make_view(log, tmp_path / "cache")
    reactors, reloader = reload_reactors(
        log, engine, Model(), workspace, view=view, config_dir=config,
        keys=KeyRing(tmp_path / "k"),
    )  # fmt: skip
    async with running_host(log, engine, reactors):
        await asyncio.wait_for(reloader.watching.wait(), 10)
        first = await reloader.propose_now(force=True)
        assert first is not None
        good = await next_reload(log, activated(first.version))
        await eventually(lambda: _is(view.active, good.version))

        (config / path).write_text(text)
        rejected = await next_reload(log, lambda e: isinstance(e, ReloadRejected))
        assert isinstance(rejected, ReloadRejected)
        assert [(p.file, p.line) for p in rejected.problems][:1] == [(path, line)], rejected
        task = submit("call skill name=greet", workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")

    assert view.active == good.version
    assert of_type(events, RunStarted)[0].config == good.version
    switches = [
        s.event async for s in read(log, log.subjects.of_type("reload.*"))
        if isinstance(s.event, ReloadActivated | ReloadRolledBack)
    ]  # fmt: skip
    assert [s.version for s in switches] == [good.version]


async def test_a_version_whose_runs_fail_is_rolled_back_automatically(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    write_config(config, greet=skill_md("greet", "Greets.", "Say HELLO."))
    view = make_view(log, tmp_path / "cache")
    reactors, reloader = reload_reactors(
        log, engine, Model(), workspace, view=view, config_dir=config,
        keys=KeyRing(tmp_path / "k"), health=HealthOptions(threshold=0.5, min_runs=2),
    )  # fmt: skip
    async with running_host(log, engine, reactors):
        await asyncio.wait_for(reloader.watching.wait(), 10)
        first = await reloader.propose_now(force=True)
        assert first is not None
        good = await next_reload(log, activated(first.version))
        ok = submit("say hi", workspace)
        await log.append(ok)
        assert not of_type(await finished(log, ok.run_id or ""), RunFailed)

        # valid configuration, but the model fails every run that sees it
        write_config(config, bad=skill_md("bad", "A poison pill.", "Nothing."))
        bad = await next_reload(
            log, lambda e: isinstance(e, ReloadActivated) and e.version != good.version
        )
        await eventually(lambda: _is(view.active, bad.version))
        failing = [submit(f"say hi {i}", workspace) for i in range(2)]
        for t in failing:
            await log.append(t)
        for t in failing:
            assert of_type(await finished(log, t.run_id or ""), RunFailed)
        back = await next_reload(log, lambda e: isinstance(e, ReloadRolledBack))
        assert isinstance(back, ReloadRolledBack)
        assert back.automatic and back.from_version == bad.version
        assert back.version == good.version and (back.runs, back.failed) == (2, 2)
        await eventually(lambda: _is(view.active, good.version))
        healed = submit("say hi again", workspace)
        await log.append(healed)
        events = await finished(log, healed.run_id or "")

    assert of_type(events, RunStarted)[0].config == good.version
    assert not of_type(events, RunFailed)
    alerts = [
        s.event async for s in read(log, log.subjects.of_type("alert.raised"))
        if isinstance(s.event, AlertRaised) and s.event.origin == "reload"
    ]  # fmt: skip
    assert len(alerts) == 1 and alerts[0].severity == "critical"


async def test_two_orchestrator_instances_switch_at_the_same_log_position(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    write_config(config, greet=skill_md("greet", "Greets.", "Say HELLO."))
    view = make_view(log, tmp_path / "cache")
    others = iter(range(100))
    reactors, reloader = reload_reactors(
        log, engine, Model(), workspace, view=view, config_dir=config,
        keys=KeyRing(tmp_path / "k"), orchestrators=2,
        views=lambda: make_view(log, tmp_path / f"cache{next(others)}"),
    )  # fmt: skip
    async with running_host(log, engine, reactors):
        await asyncio.wait_for(reloader.watching.wait(), 10)
        first = await reloader.propose_now(force=True)
        assert first is not None
        good = await next_reload(log, activated(first.version))
        tasks = [submit(f"say hi {i}", workspace) for i in range(30)]
        for i, t in enumerate(tasks):
            await log.append(t)
            if i == 14:  # a switch in the middle of the burst, while its first half is running
                (config / "skills" / "greet" / "SKILL.md").write_text(
                    skill_md("greet", "Greets anew.", "Say HELLO again.")
                )
                await reloader.propose_now()
                # the second half follows the switch (not a race with the reloader's pace)
                switched = await next_reload(
                    log, lambda e: isinstance(e, ReloadActivated) and e.version != good.version
                )
        runs = [await finished(log, t.run_id or "") for t in tasks]

    seqs = {
        s.event.run_id: s.seq async for s in read(log, log.subjects.of_type("task.submitted"))
        if isinstance(s.event, TaskSubmitted)
    }  # fmt: skip
    switch_seqs = [
        s.seq
        async for s in read(log, log.subjects.of_type("reload.activated"))
        if s.event is not None and s.event.id == switched.id
    ]
    (switch_seq,) = switch_seqs
    for task, events in zip(tasks, runs, strict=True):
        pin = of_type(events, RunStarted)[0].config
        expected = good.version if seqs[task.run_id] < switch_seq else switched.version
        assert pin == expected, (task.text, seqs[task.run_id], switch_seq)
    assert {good.version, switched.version} <= {of_type(r, RunStarted)[0].config for r in runs}
    # whichever instance started a run, each instance's view gives every task the same pin
    views = [r.config for r in reactors if isinstance(r, Orchestrator)]
    assert len(views) == 2 and views[0] is not views[1]
    for v in views:
        assert v is not None
        pins = [await v.version_at(seqs[t.run_id]) for t in tasks]
        assert pins == [of_type(r, RunStarted)[0].config for r in runs]


async def test_a_restart_comes_back_on_the_active_version(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    write_config(config, greet=skill_md("greet", "Greets.", "Say HELLO-SAVED."))
    view = make_view(log, tmp_path / "cache")
    reactors, reloader = reload_reactors(
        log, engine, Model(), workspace, view=view, config_dir=config,
        keys=KeyRing(tmp_path / "k"),
    )  # fmt: skip
    async with running_host(log, engine, reactors):
        await asyncio.wait_for(reloader.watching.wait(), 10)
        first = await reloader.propose_now(force=True)
        assert first is not None
        active = await next_reload(log, activated(first.version))
        await eventually(lambda: _is(view.active, active.version))
    await view.stop()

    # a new process: a fresh view and cache, the directory unchanged
    again = make_view(log, tmp_path / "cache-after")
    reactors, reloader = reload_reactors(
        log, engine, Model(), workspace, view=again, config_dir=config,
        keys=KeyRing(tmp_path / "k"),
    )  # fmt: skip
    async with running_host(log, engine, reactors):
        await again.ready()
        assert again.active == active.version
        assert "greet" in again.current.skills.names()
        task = submit("call skill name=greet", workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
        assert await reloader.propose_now() is None  # nothing changed: nothing proposed
    assert of_type(events, RunStarted)[0].config == active.version
    assert "HELLO-SAVED" in skill_text(events)


async def test_proposals_in_a_burst_activate_in_turn(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    write_config(config, greet=skill_md("greet", "Greets.", "Say 0."))
    view = make_view(log, tmp_path / "cache")
    reactors, reloader = reload_reactors(
        log, engine, Model(), workspace, view=view, config_dir=config,
        keys=KeyRing(tmp_path / "k"),
    )  # fmt: skip
    async with running_host(log, engine, reactors):
        await asyncio.wait_for(reloader.watching.wait(), 10)
        proposed = []
        for i in range(3):  # each proposed before the reloader decided on the one before
            (config / "skills" / "greet" / "SKILL.md").write_text(
                skill_md("greet", "Greets.", f"Say {i + 1}.")
            )
            p = await reloader.propose_now(force=True)
            assert p is not None
            proposed.append(p.version)
        await next_reload(log, activated(proposed[-1]))
        await eventually(lambda: _is(view.active, proposed[-1]))
    switches = [
        s.event async for s in read(log, log.subjects.of_type("reload.activated"))
        if isinstance(s.event, ReloadActivated)
    ]  # fmt: skip
    assert [s.version for s in switches] == proposed
    assert [s.previous for s in switches] == ["", *proposed[:-1]]
