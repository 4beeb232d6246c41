"""Agent profiles follow the run's pinned configuration version: an ``agents.yaml`` edit that
changes an agent's tools and prompt reaches the next run (its model call's tools, its system
prompt, the policy's "not enabled" check), while a run in flight keeps its version's profile."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import agents
from nanocrab.bus import EventLog
from nanocrab.events import GrantDenied, GrantIssued, LlmRequested, ReloadActivated, RunStarted
from nanocrab.routing import agent_profiles, install_profiles, parse_agents
from nanocrab.security import KeyRing

from .agent_fixtures import finished, of_type, running_host, submit
from .conftest import eventually
from .reload_rig import Model, make_view, next_reload, reload_reactors, write_config

AGENT = "reviser-profiles"


def agents_yaml(description: str, tools: str) -> str:
    return (
        f"version: 1\ndefault: {AGENT}\nagents:\n"
        f"  - name: {AGENT}\n    description: {description}\n    tools: {tools}\n"
    )


FIRST = agents_yaml("Rewrites notes the first way.", "[read, write, ls, skill]")
SECOND = agents_yaml("Reviews notes the second way, read-only.", "[read, ls, skill]")


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n")
    return ws


async def _is(a: object, b: object) -> bool:
    return a == b


def test_a_version_has_its_own_profile_table_and_unknown_versions_the_startup_one() -> None:
    name = "profiles-unit"
    one = parse_agents(agents_yaml("One way.", "[read, write]").replace(AGENT, name))
    two = parse_agents(agents_yaml("Other way.", "[read]").replace(AGENT, name))
    base = agents.base_profiles()
    built = agent_profiles(two, base)
    assert name not in base  # pure: the base is not changed
    assert built[name].tools == ("read",) and "Other way." in built[name].system_prompt
    assert built["default"] == base["default"]

    saved = dict(agents.PROFILES)
    try:
        install_profiles(one)  # the start-up table
        agents.register_profiles("v-two-unit", lambda b: agent_profiles(two, b))
        assert agents.enabled_tools(name, None) == ["read", "write"]
        assert agents.enabled_tools(name, None, "") == ["read", "write"]
        assert agents.enabled_tools(name, None, "not-registered") == ["read", "write"]
        assert agents.enabled_tools(name, None, "v-two-unit") == ["read"]
        assert agents.enabled_tools(name, ["write", "read"], "v-two-unit") == ["read"]
        assert "Other way." in agents.profile(name, "v-two-unit").system_prompt
        assert "One way." in agents.profile(name).system_prompt
        # a built-in name the version does not declare: the built-in profile (the version's file
        # is the whole declaration of that version), whatever the start-up file made of it
        assert agents.profile("explorer", "v-two-unit") == agents.BUILTIN["explorer"]
        assert agents.profile("nobody", "v-two-unit").name == "default"
    finally:
        agents.PROFILES.clear()
        agents.PROFILES.update(saved)


async def test_an_agents_edit_reaches_the_next_run_and_a_run_in_flight_keeps_its_profile(
    log: EventLog, engine: AsyncEngine, workspace: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    write_config(config)
    (config / "agents.yaml").write_text(FIRST)
    view = make_view(log, tmp_path / "cache")
    model = Model()
    reactors, reloader = reload_reactors(
        log, engine, model, workspace, view=view, config_dir=config, keys=KeyRing(tmp_path / "k")
    )
    saved = dict(agents.PROFILES)
    try:
        async with running_host(log, engine, reactors):
            await asyncio.wait_for(reloader.watching.wait(), 10)
            first = await reloader.propose_now(force=True)
            assert first is not None
            v1 = await next_reload(
                log, lambda e: isinstance(e, ReloadActivated) and e.version == first.version
            )
            await eventually(lambda: _is(view.active, v1.version))

            held = submit("call write path=a.txt hold", workspace, agent=AGENT)
            await log.append(held)
            await asyncio.wait_for(model.holding.wait(), 10)  # started on v1, first turn

            (config / "agents.yaml").write_text(SECOND)  # no write, another prompt
            v2 = await next_reload(log, lambda e: isinstance(e, ReloadActivated)
                                   and e.version != v1.version)  # fmt: skip
            await eventually(lambda: _is(view.active, v2.version))

            after = submit("call write path=b.txt", workspace, agent=AGENT)
            await log.append(after)
            late = await finished(log, after.run_id or "")
            model.release.set()  # the run in flight asks for write after the switch
            early = await finished(log, held.run_id or "")
    finally:
        agents.PROFILES.clear()
        agents.PROFILES.update(saved)

    assert of_type(early, RunStarted)[0].config == v1.version
    assert of_type(late, RunStarted)[0].config == v2.version
    # the run in flight keeps v1's tools on every model call, and its write is granted
    early_calls = of_type(early, LlmRequested)
    assert len(early_calls) >= 2
    assert all("write" in r.tools for r in early_calls)
    assert [g.tool for g in of_type(early, GrantIssued)] == ["write"]
    # the next run is offered v2's tools, and the policy refuses the tool v2 removed
    late_calls = of_type(late, LlmRequested)
    assert late_calls and all("write" not in r.tools for r in late_calls)
    assert "read" in late_calls[0].tools
    assert not of_type(late, GrantIssued)
    denied = of_type(late, GrantDenied)
    assert [d.tool for d in denied] == ["write"]
    assert "not enabled for this run" in denied[0].reason
    # each run's model got its own version's system prompt
    assert "Rewrites notes the first way." in model.systems[held.run_id or ""][0]
    assert all("second way" not in s for s in model.systems[held.run_id or ""])
    assert "Reviews notes the second way" in model.systems[after.run_id or ""][0]


def test_an_agent_may_declare_its_prompt_and_limits() -> None:
    from nanocrab.agents import PROFILES

    config = parse_agents(
        "version: 1\ndefault: reviewer\nagents:\n"
        "  - name: reviewer\n    description: reviews diffs\n"
        "    prompt: You review diffs and say what is wrong.\n    max_steps: 7\n    timeout_s: 60\n"
        "  - name: explorer\n    description: looks around\n    max_steps: 3\n"
    )
    built = agent_profiles(config, dict(PROFILES))
    reviewer, explorer = built["reviewer"], built["explorer"]
    assert reviewer.system_prompt == "You review diffs and say what is wrong."
    assert (reviewer.max_steps, reviewer.timeout_s) == (7, 60.0)
    assert explorer.max_steps == 3, "a built-in profile's limit can be set"
    assert explorer.system_prompt == PROFILES["explorer"].system_prompt, "its prompt kept"
