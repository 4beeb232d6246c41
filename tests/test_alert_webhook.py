"""The alert webhook against a real HTTP server on loopback, for each kind of alert: a budget
stop (one that ends the run and one that asks), a dead letter, a guardrail block (from a filter
that did not ask for an alert: every block is one) and a handler lagging behind the log. Each
POST is the JSON the sink sends (``handlers/alerts.py``); the receiver decodes what arrived."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import EventLog
from nanocrab.events import Budget, BusDeadLettered, RunFailed, TaskSubmitted
from nanocrab.guardrails import GuardrailsConfig
from nanocrab.handlers.alerts import AlertSink
from nanocrab.handlers.guardrails import Chain, GuardrailsHandler
from nanocrab.handlers.orchestrator import Orchestrator
from nanocrab.llm import ScriptedProvider
from nanocrab.observe import Telemetry, TelemetryHandler
from nanocrab.policy.budgets import Budgets, Limit

from .agent_fixtures import agent_reactors, finished, of_type, running_host, submit
from .conftest import eventually
from .test_otel import ONE_TOOL

pytestmark = pytest.mark.timeout(90)


class Hook:
    """A webhook receiver: an HTTP server on 127.0.0.1 keeping every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with hook.lock:
                    hook.bodies.append(
                        {"path": self.path, "content_type": self.headers.get("content-type"),
                         **json.loads(body)}
                    )  # fmt: skip
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/nanocrab"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, origin: str) -> list[dict[str, Any]]:
        with self.lock:
            return [b for b in self.bodies if b["data"]["origin"] == origin]

    async def wait(self, origin: str, count: int = 1) -> list[dict[str, Any]]:
        async def arrived() -> list[dict[str, Any]] | None:
            got = self.of(origin)
            return got if len(got) >= count else None

        result: list[dict[str, Any]] = await eventually(arrived)
        return result

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


def sink_for(hook: Hook) -> AlertSink:
    return AlertSink(hook.url, backoff_s=0.01, max_backoff_s=0.1)


async def test_budget_stops_and_dead_letters_reach_the_webhook(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, hook: Hook
) -> None:
    workspace = demo.make_workspace(tmp_path / "ws")
    telemetry = TelemetryHandler(log, telemetry_=Telemetry(processors=[]), alerts=sink_for(hook))
    asks = Budgets(session=Limit(max_tokens=1, on_exceed="ask"))
    loop = agent_reactors(log, engine, ScriptedProvider.from_text(ONE_TOOL), workspace,
                          orchestrators=())  # fmt: skip
    reactors = [Orchestrator(log, budgets=asks), *loop, telemetry]
    async with running_host(log, engine, reactors):
        stopped = submit("what is here?", workspace, budget=Budget(max_tokens=1))
        await log.append(stopped)
        events = await finished(log, stopped.run_id or "")
        assert of_type(events, RunFailed)[0].kind == "budget"
        asking = submit("what is here?", workspace)
        await log.append(asking)
        (first, second) = sorted(await hook.wait("budget", 2), key=lambda b: b["run_id"] != (
            stopped.run_id))  # fmt: skip
        assert first["run_id"] == stopped.run_id and first["type"] == "alert.raised"
        assert "stopped: the run budget" in first["data"]["summary"]
        assert first["data"]["labels"] == ["run", "tokens"] and first["data"]["id"] == first["id"]
        assert second["run_id"] == asking.run_id
        assert "waits for an approval: the session budget" in second["data"]["summary"]

        await log.append(
            BusDeadLettered(
                handler="executor", stream="nanocrab", stream_seq=7,
                subject="nanocrab.default.run.x.tool.requested", reason_kind="poison",
                reason=f"poison-{tmp_path.name}", deliveries=1,
            )
        )  # fmt: skip
        (dead,) = await hook.wait("dead_letter")
        assert dead["data"]["severity"] == "critical" and dead["run_id"] is None
        assert f"poison-{tmp_path.name}" in dead["data"]["summary"]
        assert dead["path"] == "/hooks/nanocrab" and dead["content_type"] == "application/json"


async def test_a_guardrail_block_reaches_the_webhook_without_the_filter_asking(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, hook: Hook
) -> None:
    workspace = demo.make_workspace(tmp_path / "ws")
    chain = Chain.of(GuardrailsConfig.from_mapping({"version": 1, "filters": [
        {"id": "no-payroll", "checkpoints": ["task_input"], "detector": "deny_list",
         "keywords": ["payroll"], "action": "block", "reason": "payroll is off limits"},
    ]}))  # fmt: skip
    reactors = agent_reactors(log, engine, ScriptedProvider.from_text(ONE_TOOL), workspace,
                              guardrails=chain)  # fmt: skip
    for r in reactors:
        if isinstance(r, GuardrailsHandler):
            r.alerts = sink_for(hook)
    async with running_host(log, engine, reactors):
        task = submit("send me the payroll file", workspace)
        await log.append(task)
        events = await finished(log, task.run_id or "")
    assert of_type(events, RunFailed)[0].kind == "guardrail"
    (blocked,) = await hook.wait("guardrail")
    data = blocked["data"]
    assert blocked["run_id"] == task.run_id and data["severity"] == "critical"
    assert (data["filter_id"], data["checkpoint"], data["action"]) == (
        "no-payroll", "task_input", "block",
    )  # fmt: skip
    assert "payroll is off limits" in data["summary"] and data["verdict_event_id"]


async def test_a_lagging_handler_reaches_the_webhook(
    log: EventLog, tmp_path: Path, hook: Hook
) -> None:
    from nats.js.api import ConsumerConfig

    durable = f"slow{tmp_path.name[-10:]}".replace("_", "")
    await log.js.add_consumer(log.cfg.log_stream, config=ConsumerConfig(
        durable_name=durable, filter_subject=log.subjects.of_type("task.submitted")))  # fmt: skip
    sink = sink_for(hook)
    handler = TelemetryHandler(log, telemetry_=Telemetry(processors=[]), alerts=sink,
                               handlers=[durable], lag_threshold=2)  # fmt: skip
    for _ in range(3):
        await log.append(TaskSubmitted(text="nobody reads this", run_id=f"slow-{tmp_path.name}"))
    sending = asyncio.create_task(sink.run())
    try:
        alert = await handler.poll(durable)
        assert alert is not None
        (lag,) = await hook.wait("handler_lag")
    finally:
        sending.cancel()
    assert lag["id"] == alert.id and lag["data"]["labels"] == [durable]
    assert "events behind the log (threshold 2)" in lag["data"]["summary"]
    assert lag["data"]["score"] >= 3
