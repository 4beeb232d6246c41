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
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _agent import agent_bench, breakdown
from _common import machine, pct, summary_ms


async def main(runs: int, warmup: int, breakdown_runs: int) -> None:
    print(f"machine: {machine()}")
    async with agent_bench("agent-latency") as bench:
        lat: list[float] = []
        measured: list[str] = []
        outcomes: dict[str, int] = {}
        for i in range(runs + warmup):
            task = bench.task()
            secs, outcome = await bench.run_one(task)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if i >= warmup:
                lat.append(secs)
                measured.append(task.run_id or "")
        messages, size = await bench.stream_state()
        ms = [v * 1000 for v in lat]
        p50, p99 = pct(ms, 50), pct(ms, 99)
        verdict = "OK" if p50 <= 8 and p99 <= 25 else "MISSED"
        print(f"outcomes: {outcomes} · log: {messages} events, {size / (runs + warmup):,.0f} B/run")
        print(
            f"one-tool run end to end ({runs} sequential runs, {warmup} warm-up excluded): "
            f"{summary_ms(lat)} · target p50 <= 8 ms, p99 <= 25 ms · {verdict}"
        )
        sample = measured[-breakdown_runs:] if breakdown_runs else []
        if sample:
            lines, typical = await breakdown(bench.log, sample)
            print(f"per-stage breakdown (median over {typical} of the last {len(sample)} runs):")
            print("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="measured runs (>= 200 for the target)")
    ap.add_argument("--warmup", type=int, default=30, help="runs excluded from the figures")
    ap.add_argument("--breakdown", type=int, default=100, help="runs read back for the stages")
    a = ap.parse_args()
    asyncio.run(main(a.runs, a.warmup, a.breakdown))
