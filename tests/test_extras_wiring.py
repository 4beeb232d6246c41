"""The runtime's wiring of issue 19's extras: a search key gives the agent ``web_search`` (the
policy deciding it on the provider's host), and ``hooks.yaml`` gives the handlers their hooks."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import agents, demo
from nanocrab.bus import EventLog
from nanocrab.cli.settings import Settings
from nanocrab.cli.wiring import build_reactors
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.hooks import HooksHandler
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.policy import PolicyHandler
from nanocrab.hooks import HookConfigError
from nanocrab.tools import WebSearchTool


def settings(home: Path, tmp_path: Path, **kw: object) -> Settings:
    return Settings(
        home=home, nats_url="nats://unused", db_url="sqlite+aiosqlite://", traces="none",
        sync="default", provider="scripted", script=demo.SCRIPT, user_skills=tmp_path / "skills",
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NANOCRAB_HOOKS", "NANOCRAB_CONFIG_DIR", "NANOCRAB_AGENTS", "NANOCRAB_MCP",
                 "NANOCRAB_CONNECTORS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NANOCRAB_TELEMETRY", "off")
    monkeypatch.setattr(agents, "PROFILES", dict(agents.PROFILES))  # add_default_tools


async def test_search_and_hooks_are_wired(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "hooks.yaml").write_text(
        "hooks:\n"
        "  - {name: rules, point: before_model, function: 'tests.hooks_sample:house_rules'}\n"
        "  - {name: redact, point: after_tool, function: 'tests.hooks_sample:redact'}\n"
        "  - {name: sum, point: run_end, function: 'tests.hooks_sample:summary'}\n"
    )
    s = settings(home, tmp_path, web_allow=("search.test",), search_provider="tavily",
                 search_api_key=SecretStr("k"), search_url="https://search.test/v1/search")  # fmt: skip
    reactors = build_reactors(log, sqlite_engine, s, default_workspace=tmp_path / "ws")
    (executor,) = [r for r in reactors if isinstance(r, Executor)]
    (policy,) = [r for r in reactors if isinstance(r, PolicyHandler)]
    (llm,) = [r for r in reactors if isinstance(r, LlmHandler)]
    (hooks,) = [r for r in reactors if isinstance(r, HooksHandler)]
    search = executor.registry.get("web_search")
    assert isinstance(search, WebSearchTool) and search.provider.name == "tavily"
    assert policy.tool_hosts == {"web_search": "search.test"}
    assert "web_search" in agents.profile("default").tools
    assert executor.hooks is llm.hooks is hooks.hooks
    assert [h.spec.name for h in hooks.hooks.hooks] == ["rules", "redact", "sum"]


async def test_without_a_key_or_hooks_nothing_is_added(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    reactors = build_reactors(log, sqlite_engine, settings(tmp_path / "home", tmp_path),
                              default_workspace=tmp_path / "ws")  # fmt: skip
    (executor,) = [r for r in reactors if isinstance(r, Executor)]
    assert "web_search" not in executor.registry.names() and executor.hooks is None
    assert not any(isinstance(r, HooksHandler) for r in reactors)


async def test_a_bad_hook_stops_start_up(
    log: EventLog, sqlite_engine: AsyncEngine, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "hooks.yaml").write_text(
        "hooks:\n  - {name: x, point: run_end, function: 'tests.hooks_sample:nope'}\n"
    )
    with pytest.raises(HookConfigError, match="hook 'x'"):
        build_reactors(log, sqlite_engine, settings(home, tmp_path),
                       default_workspace=tmp_path / "ws")  # fmt: skip
