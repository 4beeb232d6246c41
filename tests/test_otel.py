"""GenAI spans and metrics of a real one-tool run, exported over OTLP/HTTP to a real receiver
on loopback (``otlp_receiver.py``) and decoded from protobuf: names, attributes, parent links,
one trace per run, message content only when opted in, and the metrics the run moved."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab import demo
from nanocrab.bus import EventLog, read_run
from nanocrab.events import Event, LlmResponded, RunCompleted, ToolCompleted
from nanocrab.llm import ScriptedProvider
from nanocrab.observe import Telemetry, TelemetryHandler
from nanocrab.observe.spans import agent_span_id

from .agent_fixtures import agent_reactors, finished, of_type, running_host, submit
from .conftest import eventually
from .otlp_receiver import Point, Receiver, Span

ONE_TOOL = """
scripts:
  - name: main
    turns:
      - text: "let me look"
        tool_calls: [{name: ls, input: {path: "."}}]
      - text: "there are files"
"""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def engine(sqlite_engine: AsyncEngine) -> AsyncEngine:
    return sqlite_engine


def otlp_telemetry(receiver: Receiver) -> Telemetry:
    spans = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")
    metrics = OTLPMetricExporter(endpoint=f"{receiver.endpoint}/v1/metrics")
    return Telemetry(
        "nanocrab-test",
        processors=[BatchSpanProcessor(spans, schedule_delay_millis=100)],
        readers=[PeriodicExportingMetricReader(metrics, export_interval_millis=60_000)],
    )


async def one_tool_run(
    log: EventLog,
    engine: AsyncEngine,
    tmp_path: Path,
    receiver: Receiver,
    *,
    content: bool,
    live: bool = False,
) -> tuple[list[Event], Telemetry]:
    """A one-tool run on the real agent loop with the telemetry handler beside it; returns the
    run's events once its ``invoke_agent`` span reached the receiver."""
    tele = otlp_telemetry(receiver)
    workspace = demo.make_workspace(tmp_path / "ws")
    handler = TelemetryHandler(log, telemetry_=tele, content=content, live=live)
    provider = ScriptedProvider.from_text(ONE_TOOL)
    reactors = [*agent_reactors(log, engine, provider, workspace), handler]
    async with running_host(log, engine, reactors):
        task = submit("what is here?", workspace)
        await log.append(task)
        await finished(log, task.run_id or "")

        async def exported() -> bool:
            await asyncio.to_thread(tele.flush)
            return any(s.attributes.get("nanocrab.run_id") == task.run_id
                       for s in receiver.named("invoke_agent"))  # fmt: skip

        await eventually(exported)
    events = [s.event for s in await read_run(log, task.run_id or "") if s.event is not None]
    await asyncio.to_thread(tele.shutdown)  # its last export while the receiver still listens
    return events, tele


def of_run(receiver: Receiver, run_id: str) -> dict[str, Span]:
    spans = [s for s in receiver.spans if s.attributes.get("nanocrab.run_id") == run_id]
    by_name: dict[str, Span] = {}
    for s in spans:
        by_name.setdefault(s.name.split(" ")[0], s)
    return by_name


def chats_of(receiver: Receiver, run_id: str) -> list[Span]:
    found = [s for s in receiver.named("chat ") if s.attributes["nanocrab.run_id"] == run_id]
    return sorted(found, key=lambda s: s.start_ns)


@pytest.mark.parametrize("live", [False, True], ids=["at-run-end", "live"])
async def test_a_one_tool_run_is_one_trace_of_genai_spans(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, receiver: Receiver, live: bool
) -> None:
    """The same spans whether exported with the run's end or each as it ends (``live``)."""
    events, _ = await one_tool_run(log, engine, tmp_path, receiver, content=False, live=live)
    task, run_id = events[0], events[0].run_id or ""
    assert task.trace is not None
    _, trace_id, root_span, _ = task.trace.split("-")
    spans = of_run(receiver, run_id)
    assert set(spans) == {"invoke_agent", "chat", "execute_tool", "policy"}
    assert len([s for s in receiver.spans if s.attributes.get("nanocrab.run_id") == run_id]) == 5
    agent, tool, policy = spans["invoke_agent"], spans["execute_tool"], spans["policy"]
    chats = chats_of(receiver, run_id)
    assert len(chats) == 2, "two model calls"
    # one trace: the task's; invoke_agent hangs from the span that published the task
    assert {s.trace_id for s in [*spans.values(), *chats]} == {trace_id}
    assert agent.parent_id == root_span and agent.span_id == f"{agent_span_id(run_id):016x}"
    assert all(s.parent_id == agent.span_id for s in [tool, policy, *chats])
    # the handlers' own events carry the same trace hop by hop
    assert {e.trace.split("-")[1] for e in events if e.trace} == {trace_id}

    assert agent.name == "invoke_agent default" and agent.service == "nanocrab-test"
    a = agent.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "default"
    assert a["nanocrab.outcome"] == "completed" and a["nanocrab.run.steps"] == 2
    responses = of_type(events, LlmResponded)
    assert a["gen_ai.usage.output_tokens"] == sum(r.usage.output_tokens for r in responses)
    assert a["gen_ai.conversation.id"] == task.session_id
    (completed,) = of_type(events, RunCompleted)

    first = chats[0]
    c = first.attributes
    assert first.name == f"chat {responses[0].model}" and first.kind == 3  # SPAN_KIND_CLIENT
    assert c["gen_ai.operation.name"] == "chat" and c["gen_ai.provider.name"] == "scripted"
    assert c["gen_ai.response.model"] == responses[0].model
    assert c["gen_ai.response.id"] == responses[0].id
    assert c["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert c["gen_ai.usage.input_tokens"] == responses[0].usage.input_tokens
    assert c["gen_ai.usage.output_tokens"] == responses[0].usage.output_tokens
    assert c["gen_ai.usage.cache_read.input_tokens"] == 0
    assert "gen_ai.output.messages" not in c, "content is opt-in"

    (done,) = of_type(events, ToolCompleted)
    t = tool.attributes
    assert tool.name == "execute_tool ls" and t["gen_ai.tool.name"] == "ls"
    assert t["gen_ai.tool.call.id"] == done.call_id
    assert t["gen_ai.operation.name"] == "execute_tool"
    assert "gen_ai.tool.call.arguments" not in t and "gen_ai.tool.call.result" not in t
    assert policy.attributes["nanocrab.policy.decision"] == "granted"
    assert policy.attributes["nanocrab.policy.tier"] == "safe"
    # the order the log says: the policy granted, then the tool ran, within the run
    assert agent.start_ns <= policy.start_ns <= policy.end_ns <= tool.start_ns <= tool.end_ns
    assert tool.end_ns <= agent.end_ns
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert agent.end_ns // 1000 == (completed.time - epoch) // timedelta(microseconds=1)


async def test_message_content_is_recorded_only_when_opted_in(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, receiver: Receiver
) -> None:
    events, _ = await one_tool_run(log, engine, tmp_path, receiver, content=True)
    run_id = events[0].run_id or ""
    tool = of_run(receiver, run_id)["execute_tool"]
    assert '"path":"."' in tool.attributes["gen_ai.tool.call.arguments"]
    assert tool.attributes["gen_ai.tool.call.result"]
    messages = [s.attributes["gen_ai.output.messages"] for s in chats_of(receiver, run_id)]
    assert "there are files" in messages[-1]


async def test_the_run_moves_the_genai_and_nanocrab_metrics(
    log: EventLog, engine: AsyncEngine, tmp_path: Path, receiver: Receiver
) -> None:
    events, _ = await one_tool_run(log, engine, tmp_path, receiver, content=False)
    responses = of_type(events, LlmResponded)
    model = responses[0].model

    def points(name: str, **attrs: object) -> list[Point]:
        """The latest point of each attribute set (cumulative: each export repeats them)."""
        latest = {tuple(sorted(p.attributes.items())): p for p in receiver.metric(name)}
        found = latest.values()
        return [p for p in found if all(p.attributes.get(k) == v for k, v in attrs.items())]

    token = {"gen_ai.token.type": "output", "gen_ai.response.model": model}
    (out,) = points("gen_ai.client.token.usage", **token)
    assert out.unit == "{token}" and out.count == 2
    assert out.value == sum(r.usage.output_tokens for r in responses)
    (duration,) = points("gen_ai.client.operation.duration", **{"gen_ai.operation.name": "chat"})
    assert duration.unit == "s" and duration.count == 2
    (tool,) = points("nanocrab.tool.duration", **{"gen_ai.tool.name": "ls"})
    assert tool.count == 1 and tool.attributes["nanocrab.outcome"] == "ok"
    (runs,) = points("nanocrab.runs", **{"nanocrab.outcome": "completed"})
    assert runs.value == 1 and runs.attributes["gen_ai.agent.name"] == "default"
    assert points("nanocrab.handler.lag", **{"nanocrab.handler": "telemetry"})
