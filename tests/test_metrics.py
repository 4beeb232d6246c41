"""Metrics on a Prometheus endpoint, scraped: the telemetry's own reader on a run, and
``nanocrab up --metrics-port`` as a user starts it. Alerts the telemetry handler raises: budget
stops, dead letters and handler lag, on the log and at the webhook."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import EventLog, read
from nanocrab.bus.server import free_port
from nanocrab.events import AlertRaised, Budget, BusDeadLettered, TaskSubmitted
from nanocrab.handlers.alerts import AlertSink
from nanocrab.llm import ScriptedProvider
from nanocrab.observe import Telemetry, TelemetryHandler
from nanocrab.observe.export import prometheus_reader

from .agent_fixtures import agent_reactors, finished, running_host, submit
from .conftest import eventually
from .test_cli import NANOCRAB, user_env
from .test_otel import ONE_TOOL


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


def scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


async def test_a_run_shows_on_the_prometheus_endpoint(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    port = free_port()
    tele = Telemetry("nanocrab-test", processors=[],
                     readers=[prometheus_reader(port, registry=CollectorRegistry())])  # fmt: skip
    workspace = demo.make_workspace(tmp_path / "ws")
    reactors = [
        *agent_reactors(log, engine, ScriptedProvider.from_text(ONE_TOOL), workspace),
        TelemetryHandler(log, telemetry_=tele),
    ]
    async with running_host(log, engine, reactors):
        task = submit("what is here?", workspace)
        await log.append(task)
        await finished(log, task.run_id or "")

        async def scraped() -> str | None:
            text = await asyncio.to_thread(scrape, port)
            done = sample(text, "nanocrab_runs_total", nanocrab_outcome="completed")
            return text if done == 1 else None

        text = await eventually(scraped)
    tele.shutdown()
    assert sample(text, "gen_ai_client_token_usage_count", gen_ai_token_type="output") == 2
    assert sample(text, "gen_ai_client_operation_duration_seconds_count",
                  gen_ai_operation_name="chat") == 2  # fmt: skip
    assert sample(text, "nanocrab_tool_duration_seconds_count", gen_ai_tool_name="ls",
                  nanocrab_outcome="ok") == 1  # fmt: skip
    assert sample(text, "nanocrab_handler_lag_seconds_count", nanocrab_handler="telemetry")


def test_up_serves_metrics_on_its_metrics_port(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    up = subprocess.Popen(
        [*NANOCRAB, "up", "--metrics-port", str(port)], cwd=tmp_path,
        env=user_env(home, NANOCRAB_TRACES="none"), text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        banner = up.stdout.readline()
        assert "nanocrab up" in banner, banner + (up.stderr.read() if up.poll() is not None else "")
        assert f"metrics on http://127.0.0.1:{port}/metrics" in up.stdout.readline()
        deadline, text = time.monotonic() + 30, ""
        while time.monotonic() < deadline:  # the first poll of the handlers' consumers
            text = scrape(port)
            if sample(text, "nanocrab_handler_pending", nanocrab_handler="llm") is not None:
                break
            time.sleep(0.2)
        assert sample(text, "nanocrab_handler_pending",
                      nanocrab_handler="orchestrator") is not None, text  # fmt: skip
        assert sample(text, "nanocrab_handler_redelivered", nanocrab_handler="policy") == 0
        assert 'service_name="nanocrab-up"' in text
    finally:
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=30)
    assert up.returncode == 0, err
    assert "stopped cleanly" in out


# -- alerts ------------------------------------------------------------------------------------


class Webhook:
    """The alert webhook's receiving end, at the HTTP layer."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(request.content))
        return httpx.Response(204)


async def alerts_of(log: EventLog, origin: str, count: int = 1) -> list[AlertRaised]:
    async def found() -> list[AlertRaised] | None:
        alerts = [s.event async for s in read(log, log.subjects.of_type("alert.raised"))
                  if isinstance(s.event, AlertRaised) and s.event.origin == origin]  # fmt: skip
        return alerts if len(alerts) >= count else None

    result: list[AlertRaised] = await eventually(found)
    return result


async def test_budget_stops_and_dead_letters_raise_alerts_at_the_webhook(
    log: EventLog, engine: AsyncEngine, tmp_path: Path
) -> None:
    hook = Webhook()
    sink = AlertSink("http://alerts.test/hook", transport=httpx.MockTransport(hook))
    handler = TelemetryHandler(log, telemetry_=Telemetry(processors=[]), alerts=sink)
    workspace = demo.make_workspace(tmp_path / "ws")
    reactors = [
        *agent_reactors(log, engine, ScriptedProvider.from_text(ONE_TOOL), workspace),
        handler,
    ]
    async with running_host(log, engine, reactors):
        task = submit("what is here?", workspace, budget=Budget(max_tokens=1))
        await log.append(task)
        await finished(log, task.run_id or "")
        (budget,) = await alerts_of(log, "budget")
        assert budget.run_id == task.run_id and budget.source == "telemetry"
        assert "run budget" in budget.summary and budget.labels == ["run", "tokens"]

        marker = f"poison-{tmp_path.name}"
        await log.append(
            BusDeadLettered(
                handler="executor",
                stream="nanocrab",
                stream_seq=7,
                subject="nanocrab.default.run.x.tool.requested",
                reason_kind="poison",
                reason=marker,
                deliveries=1,
            )
        )

        async def dead() -> list[AlertRaised] | None:
            alerts = await alerts_of(log, "dead_letter")
            return [a for a in alerts if marker in a.summary] or None

        (alert,) = await eventually(dead)
        assert alert.severity == "critical" and alert.labels == ["executor", "poison"]

        async def posted() -> bool:
            kinds = {b["data"]["origin"] for b in hook.bodies}  # type: ignore[index]
            return {"budget", "dead_letter"} <= kinds

        await eventually(posted)


async def test_a_handler_behind_its_threshold_raises_one_lag_alert(
    log: EventLog, tmp_path: Path
) -> None:
    from nats.js.api import ConsumerConfig

    durable = f"lagging{tmp_path.name[-10:]}".replace("_", "")
    subject = log.subjects.of_type("task.submitted")
    await log.js.add_consumer(log.cfg.log_stream, config=ConsumerConfig(
        durable_name=durable, filter_subject=subject))  # fmt: skip
    handler = TelemetryHandler(log, telemetry_=Telemetry(processors=[]), handlers=[durable],
                               lag_threshold=2)  # fmt: skip
    before = (await log.js.consumer_info(log.cfg.log_stream, durable)).num_pending
    assert await handler.poll(durable) is None or before > 2
    for _ in range(3):
        await log.append(TaskSubmitted(text="nobody reads this", run_id=f"lag-{tmp_path.name}"))
    alert = await handler.poll(durable)
    assert alert is not None and alert.origin == "handler_lag" and durable in alert.summary
    assert await handler.poll(durable) is None, "one alert per episode"
    assert handler.telemetry.instruments.pending[durable] >= 3
    (stored,) = [a for a in await alerts_of(log, "handler_lag") if a.labels == [durable]]
    assert stored.id == alert.id


def test_the_grafana_dashboard_queries_only_metrics_nanocrab_exports() -> None:
    """Every series deploy/grafana/nanocrab.json reads is one the Prometheus endpoint serves,
    and every instrument has a panel."""
    import re

    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    tele = Telemetry(processors=[], readers=[PrometheusMetricReader(registry=registry)])
    m, a = tele.instruments, {"k": "v"}
    for h in (m.token_usage, m.operation_duration, m.tool_duration, m.approval_wait,
              m.handler_lag):  # fmt: skip
        h.record(1, a)
    for c in (m.runs, m.cost, m.approvals_waiting, m.budget_exceeded, m.dead_letters, m.sandbox,
              m.guardrail):  # fmt: skip
        c.add(1, a)
    m.pending["h"] = m.redelivered["h"] = 0
    served = {
        line.split(" ")[0].split("{")[0]
        for line in generate_latest(registry).decode().splitlines()
        if line and not line.startswith("#")
    }
    dashboard = json.loads(
        (Path(__file__).parents[1] / "deploy" / "grafana" / "nanocrab.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    bare = [re.sub(r"\bby \([^)]*\)", "", e) for e in exprs]  # label lists are not series
    queried = {n for e in bare for n in re.findall(r"\b(?:gen_ai|nanocrab)_[a-zA-Z_]+", e)}
    assert queried <= served, queried - served
    families = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in served}
    families.discard("target_info")
    assert {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in queried} == families
    tele.shutdown()
