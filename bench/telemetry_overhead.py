"""The telemetry handler's own cost per run, in isolation: the GenAI spans and metrics of a folded
one-tool run (10 spans handed to an OTLP batch processor, 7 metric recordings), over 1800 runs
after 200 warm-up.

Usage: .venv/bin/python bench/telemetry_overhead.py http://127.0.0.1:PORT
(an OTLP/HTTP receiver, e.g. ``tests/otlp_receiver.py`` run as its own process; see
docs/observability.md, "Overhead").
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import timedelta

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from nanocrab.events import (
    Event,
    GrantIssued,
    GuardrailChecked,
    LlmRequested,
    LlmResponded,
    RunCompleted,
    RunStarted,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolRequested,
    ToolStarted,
    ToolUseBlock,
    Usage,
    utcnow,
)
from nanocrab.handlers.runstate import RunState
from nanocrab.observe import Telemetry, TelemetryHandler, spans_for
from nanocrab.observe.handler import PER_EVENT

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def one_tool_run(i: int) -> tuple[RunState, Event]:
    t0, rid = utcnow(), f"run{i}"

    def env(ms: float) -> dict[str, object]:
        return {"run_id": rid, "session_id": "s", "time": t0 + timedelta(milliseconds=ms)}

    call = ToolUseBlock("c1", "ls", {"path": "."})
    events: list[Event] = [
        TaskSubmitted(text="x", trace=TRACE, **env(0)),  # type: ignore[arg-type]
        RunStarted(**env(1)),  # type: ignore[arg-type]
        LlmRequested(turn=0, **env(2)),  # type: ignore[arg-type]
        LlmResponded(provider="scripted", model="m", stop_reason="tool_use", content=[call],
                     latency_ms=1, usage=Usage(input_tokens=100, output_tokens=10), **env(3)),  # type: ignore[arg-type]
        ToolRequested(call_id="c1", tool="ls", arguments={"path": "."}, **env(4)),  # type: ignore[arg-type]
        GrantIssued(grant_id="g", call_id="c1", tool="ls", capabilities=[], scope="step",
                    tier="safe", expires_at=t0 + timedelta(minutes=5), **env(5)),  # type: ignore[arg-type]
        ToolStarted(call_id="c1", tool="ls", invocation_id="i", **env(6)),  # type: ignore[arg-type]
        ToolCompleted(call_id="c1", tool="ls", content=[TextBlock("a b")], duration_ms=2,
                      **env(7)),  # type: ignore[arg-type]
        *[GuardrailChecked(checkpoint="reply", target_id=str(k), action="allow",
                           duration_ms=0.1, **env(8)) for k in range(4)],  # type: ignore[arg-type]
        LlmRequested(turn=1, **env(9)),  # type: ignore[arg-type]
        LlmResponded(provider="scripted", model="m", stop_reason="end_turn",
                      content=[TextBlock("done")], latency_ms=1,
                      usage=Usage(input_tokens=120, output_tokens=3), **env(10)),  # type: ignore[arg-type]
        RunCompleted(reply="done", steps=2, **env(11)),  # type: ignore[arg-type]
    ]  # fmt: skip
    state = RunState(rid)
    for seq, e in enumerate(events, 1):
        state.apply(e, seq)
    return state, events[-1]


def main(endpoint: str, runs: int = 1800, warmup: int = 200) -> None:
    tele = Telemetry(
        "telemetry-overhead",
        processors=[BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"))],
        readers=[PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics"), export_interval_millis=10_000
        )],
    )  # fmt: skip
    record = TelemetryHandler._record  # the metric part of the handler, without a bus
    holder = TelemetryHandler.__new__(TelemetryHandler)
    holder.telemetry = tele
    states = [one_tool_run(i) for i in range(runs + warmup)]
    times: list[float] = []
    for state, end in states:
        t = time.perf_counter()
        for e in [e for e in state.events if isinstance(e, PER_EVENT)] + [end]:
            for span in spans_for(e, state):
                tele.export(span)
            record(holder, e, state)
        times.append((time.perf_counter() - t) * 1000)
        time.sleep(0.0005)  # a run every half millisecond at most: the batch queue keeps up
    times = times[warmup:]
    p99 = statistics.quantiles(times, n=100)[98]
    print(f"spans and metrics of one one-tool run ({runs} runs, {warmup} warm-up excluded): "
          f"p50 {statistics.median(times):.3f} ms · p99 {p99:.3f} ms · "
          f"{tele.exported} spans exported")  # fmt: skip
    tele.flush()
    tele.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
