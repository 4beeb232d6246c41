"""Agent-loop run latency: ``task.submitted`` appended → ``run.completed`` seen by a subscriber.

The real agent loop (orchestrator, policy, executor, LLM handler, projections on SQLite, default
``RuntimeOptions``) runs in this process on a private embedded nats-server. The scripted model
(zero model latency) answers every task with one ``read`` of a 10-line file, then a short answer:
12 events per run. Runs are sequential, each in a new session; the first ``--warmup`` runs are
excluded. The observer is a plain NATS subscription on ``<root>.*.run.*.run.completed``.

Then a per-stage breakdown: for the measured runs, the events are read back with ``read_run`` and
the time between consecutive events (their ``time`` fields, i.e. when the emitting handler built
them; and JetStream's storage timestamps) is reported as the median over runs.

Usage: .venv/bin/python bench/agent_latency.py [--runs 300] [--warmup 30] [--breakdown 100]
Diagnosis: [--projections all|sessions|none] [--traces none|console] [--switch-interval-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _agent import CpuMeter, agent_bench, breakdown, calibration
from _common import machine, pct, summary_ms

from nanocrab.bus.tracing import configure_tracing

TASK_TEXT = "what is in notes.txt?"
TEXTS = [
    f"{verb} notes.txt{tail}"
    for tail in ("", " please", " and tell me", " for me", " quickly", " in the workspace",
                 " briefly", " now", " so I can plan", " before lunch", " and summarise it",
                 " for the review", " word for word", " again", " from the top")
    for verb in ("what is in", "read", "show me", "open", "look at", "check", "summarise",
                 "tell me about", "go through", "list what is in", "have a look at",
                 "what does it say in", "read out", "inspect", "skim", "peek into",
                 "what's written in", "print", "explain", "review", "scan")
]
"""315 distinct wordings of the one-tool task (the scripted model answers all alike)."""


async def main(
    runs: int,
    warmup: int,
    breakdown_runs: int,
    projections: str,
    switch_ms: float | None,
    traces: str,
    config: str,
    texts: str = "varied",
) -> None:
    if switch_ms is not None:
        sys.setswitchinterval(switch_ms / 1000)
    trace_file = None
    if config == "production":
        projections, traces = "all (in the projection worker's process)", "console (traces.jsonl)"
    elif traces == "console":  # as the CLI does by default: JSON Lines in a file
        trace_file = Path(tempfile.mkdtemp(prefix="nanocrab-bench-traces-")) / "traces.jsonl"
        configure_tracing("agent-latency", exporter="console", console_path=trace_file)
    print(
        f"machine: {machine()} · config: {config} · projections: {projections} · "
        f"traces: {traces} · task texts: {texts} · "
        f"GIL switch interval {sys.getswitchinterval() * 1000:g} ms"
    )
    print(calibration())
    async with agent_bench(
        "agent-latency", projections=projections.split()[0], config=config
    ) as bench:
        lat: list[float] = []
        measured: list[str] = []
        outcomes: dict[str, int] = {}
        cpu = CpuMeter(bench.log.nc)
        superseded_before: dict[str, int] = {}
        for i in range(runs + warmup):
            if i == warmup:
                cpu.start()
                bench.handle_times.clear()
                superseded_before = {rt.durable: rt.superseded for rt in bench.host.runtimes}
            task = bench.task(TEXTS[i % len(TEXTS)] if texts == "varied" else TASK_TEXT)
            secs, outcome = await bench.run_one(task)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if i >= warmup:
                lat.append(secs)
                measured.append(task.run_id or "")
        cpu.stop()
        messages, size = await bench.stream_state()
        ms = [v * 1000 for v in lat]
        p50, p99 = pct(ms, 50), pct(ms, 99)
        verdict = "OK" if p50 <= 8 and p99 <= 25 else "MISSED"
        print(f"outcomes: {outcomes} · log: {messages} events, {size / (runs + warmup):,.0f} B/run")
        print(
            f"one-tool run end to end ({runs} sequential runs, {warmup} warm-up excluded): "
            f"{summary_ms(lat)} · target p50 <= 8 ms, p99 <= 25 ms · {verdict}"
        )
        print(cpu.report(runs))
        superseded = {rt.durable: rt.superseded - superseded_before.get(rt.durable, 0)
                      for rt in bench.host.runtimes}  # fmt: skip
        print("decisions superseded by an event landing first (decided again on its delivery): "
              + (" · ".join(f"{k} {v / runs:.2f}/run" for k, v in sorted(superseded.items()) if v)
                 or "none"))  # fmt: skip
        print("time inside handle() (the handler's own work, incl. its reads of the log/SQL):")
        print("\n".join(bench.handle_report()))
        sample = measured[-breakdown_runs:] if breakdown_runs else []
        if sample:
            lines, typical = await breakdown(bench.log, sample)
            print(f"per-stage breakdown (median over {typical} of the last {len(sample)} runs):")
            print("\n".join(lines))
        if config == "production":
            home = bench.tmp / "home"
            provider = trace.get_tracer_provider()
            if isinstance(provider, TracerProvider):
                provider.force_flush()
            await asyncio.sleep(0)
            traces_b = (home / "traces.jsonl").stat().st_size
            sql_b = sum(f.stat().st_size for f in home.glob("*.db"))
            # the write-ahead log is a reused buffer (checkpointed into the file): not per task
            wal_b = sum(f.stat().st_size for f in home.glob("*.db-*"))
            n = runs + warmup
            print(
                f"stored per one-tool task: log {size / n:,.0f} B · SQLite {sql_b / n:,.0f} B "
                f"(all projections, database files, before the worker's final catch-up; plus "
                f"{wal_b / 1024:,.0f} KiB of write-ahead log in all) · traces "
                f"{traces_b / n:,.0f} B (JSON Lines)"
            )
    if trace_file is not None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, TracerProvider):
            provider.force_flush()
        size = trace_file.stat().st_size
        print(f"traces: {size / (runs + warmup):,.0f} B/run (JSON Lines)")
        shutil.rmtree(trace_file.parent, ignore_errors=True)
    print(f"at the end: {calibration()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="measured runs (>= 200 for the target)")
    ap.add_argument("--warmup", type=int, default=30, help="runs excluded from the figures")
    ap.add_argument("--breakdown", type=int, default=100, help="runs read back for the stages")
    ap.add_argument(
        "--config",
        choices=("production", "bare"),
        default="production",
        help="production (default): what `nanocrab up` runs — per-identity nkeys under broker "
        "permissions, the default policy, console tracing, every projection in its worker "
        "process; bare: one unauthenticated connection, no tracing, --projections/--traces apply",
    )
    ap.add_argument(
        "--projections",
        choices=("all", "sessions", "none"),
        default="all",
        help="diagnosis: which SQL projections run alongside (default: all, as in production; "
        "none also turns off the LLM handler's session-history query)",
    )
    ap.add_argument(
        "--traces",
        choices=("none", "console"),
        default="none",
        help="console: spans as JSON Lines to a file, the CLI's default (default: none)",
    )
    ap.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="diagnosis: sys.setswitchinterval (the GIL hand-off interval, default 5 ms)",
    )
    ap.add_argument(
        "--texts",
        choices=("varied", "same"),
        default="varied",
        help="varied (default): each run's task is worded differently, as users' are, so "
        "embeddings (guardrails, memory recall) are computed, not served from the cache; same: "
        "one text for every run",
    )
    a = ap.parse_args()
    asyncio.run(
        main(a.runs, a.warmup, a.breakdown, a.projections, a.switch_interval_ms, a.traces,
             a.config, a.texts)
    )
