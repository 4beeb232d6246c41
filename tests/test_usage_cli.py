"""``nanocrab usage`` as a user runs it, on a seeded log of its own server: groups, ``--since``,
``--json``, ``--exceeded``; and the pricing table behind the costs."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from nanocrab.bus import BusConfig, EmbeddedServer, EventLog, connect
from nanocrab.bus.server import free_port
from nanocrab.events import BudgetExceeded, Event, LlmResponded, RunStarted, Usage, utcnow
from nanocrab.llm.pricing import cost_usd, price_for

from .test_cli import cli


def responded(run: str, session: str, tenant: str, model: str, tokens: int, usd: float,
              days_ago: int = 0) -> LlmResponded:  # fmt: skip
    return LlmResponded(
        provider="anthropic", model=model, content=[], stop_reason="end_turn",
        usage=Usage(input_tokens=tokens, output_tokens=10, cache_read_tokens=5),
        cost_usd=usd, latency_ms=100.0, run_id=run, session_id=session, tenant=tenant,
        time=utcnow() - timedelta(days=days_ago),
    )  # fmt: skip


def seed_events() -> list[Event]:
    return [
        RunStarted(agent="default", run_id="r1", session_id="s1", tenant="acme"),
        RunStarted(agent="explorer", run_id="r2", session_id="s1", tenant="acme"),
        RunStarted(agent="default", run_id="r3", session_id="s2", tenant="globex"),
        responded("r1", "s1", "acme", "claude-sonnet-4-5", 1000, 0.5),
        responded("r1", "s1", "acme", "claude-sonnet-4-5", 2000, 0.25),
        responded("r2", "s1", "acme", "claude-haiku-4-5", 100, 0.01),
        responded("r3", "s2", "globex", "claude-opus-4-5", 300, 2.0, days_ago=3),
        BudgetExceeded(scope="tenant", key="globex", limit="usd", spent_usd=2.0,
                       spent_tokens=315, max_usd=1.0, turn=1, run_id="r3", tenant="globex"),
    ]  # fmt: skip


async def seed(url: str, home: Path) -> None:
    nc = await connect(url, name="seed")
    try:
        log = await EventLog.open(nc, BusConfig(url=url, data_dir=home))
        await log.append_batch(seed_events())
    finally:
        with contextlib.suppress(Exception):
            await nc.drain()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    base = tmp_path_factory.mktemp("usage-cli")
    server = EmbeddedServer(base / "nats", port=free_port())
    url = server.start()
    home = base / "home"
    asyncio.run(seed(url, home))
    try:
        yield home, {"NANOCRAB_NATS_URL": url}
    finally:
        server.stop()


def rows(home: Path, env: dict[str, str], *args: str) -> dict[str, dict[str, object]]:
    result = cli(home, "usage", "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    return {r["key"]: r for r in map(json.loads, result.stdout.splitlines())}


def test_usage_groups_by_run_session_agent_tenant_and_model(
    seeded: tuple[Path, dict[str, str]],
) -> None:
    home, env = seeded
    by_run = rows(home, env)
    assert list(by_run) == ["r3", "r1", "r2"], "costliest first"
    assert by_run["r1"]["calls"] == 2 and by_run["r1"]["input_tokens"] == 3000
    assert by_run["r1"]["cost_usd"] == 0.75 and by_run["r1"]["tokens"] == 3030
    assert rows(home, env, "--by", "session")["s1"]["calls"] == 3
    agents = rows(home, env, "--by", "agent")
    assert agents["default"]["calls"] == 3 and agents["explorer"]["calls"] == 1
    tenants = rows(home, env, "--by", "tenant")
    assert tenants["acme"]["cost_usd"] == pytest.approx(0.76) and tenants["globex"]["calls"] == 1
    assert set(rows(home, env, "--by", "model")) == {
        "claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-5",
    }  # fmt: skip
    assert len(rows(home, env, "--by", "day")) == 2


def test_usage_since_and_tenant_filter(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    assert set(rows(home, env, "--since", "1d")) == {"r1", "r2"}
    assert set(rows(home, env, "--tenant", "globex")) == {"r3"}


def test_usage_table_and_budget_stops(seeded: tuple[Path, dict[str, str]]) -> None:
    home, env = seeded
    table = cli(home, "usage", "--by", "tenant", env=env)
    assert table.returncode == 0, table.stderr
    assert "usage by tenant" in table.stdout and "acme" in table.stdout
    assert "2.7600" in table.stdout, "the total row"
    stops = cli(home, "usage", "--exceeded", "--json", env=env)
    assert stops.returncode == 0, stops.stderr
    (stop,) = map(json.loads, stops.stdout.splitlines())
    assert (stop["run_id"], stop["scope"], stop["key"], stop["max_usd"]) == (
        "r3", "tenant", "globex", 1.0,
    )  # fmt: skip
    bad = cli(home, "usage", "--by", "week", env=env)
    assert bad.returncode == 2 and "unknown --by" in bad.stderr


def test_pricing_table_prices_current_models_per_million_tokens() -> None:
    one_m = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert cost_usd("claude-sonnet-4-5-20250929", one_m) == 18.0
    assert cost_usd("claude-opus-4-5", one_m) == 30.0
    assert cost_usd("claude-opus-4-1", one_m) == 90.0
    assert cost_usd("claude-haiku-4-5", one_m) == 6.0
    cached = Usage(cache_read_tokens=1_000_000, cache_write_tokens=1_000_000)
    assert cost_usd("claude-sonnet-4-5", cached) == pytest.approx(0.30 + 3.75)
    assert price_for("scripted:main") is None and cost_usd("scripted:main", one_m) == 0.0
