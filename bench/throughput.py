"""Agent-loop throughput with many runs in flight, and that no run is lost.

The real agent loop (orchestrator, policy, executor, LLM handler, all SQLite projections, default
``RuntimeOptions``) on a private embedded nats-server, scripted model (zero model latency), each
run one ``read`` of a 10-line file then an answer (12 events per run). Each round submits
``--inflight`` tasks at once (concurrent appends, each task in its own session) and waits until
every run has a terminal event, seen by a plain NATS subscription on
``<root>.*.run.*.run.{completed,failed,cancelled}``. A smaller warm-up round comes first.

Prints per round: runs/s and events/s (log stream messages appended during the round / its wall
time), completion-time spread, and the checks: every run completed (its first terminal event), no
run.failed, every run's events read back (batched direct gets) are exactly the one-tool flow (no
duplicate step), no dead letters, superseded orchestrator decisions (harmless, but wasted work).

Usage: .venv/bin/python bench/throughput.py [--inflight 100] [--rounds 3] [--timeout 120]
       [--burst 1000] (then a thousand in flight: none lost, the first done within 2 s)
Diagnosis: [--projections all|sessions|none]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _agent import (
    BESIDE_THE_FLOW,
    ONE_TOOL_FLOW,
    AgentBench,
    CpuMeter,
    agent_bench,
    calibration,
)
from _common import machine, pct

from nanocrab.bus import read_run, sanitize_token
from nanocrab.bus.direct import DirectReader
from nanocrab.events import EventDecodeError
from nanocrab.handlers import runloader


async def burst(bench: AgentBench, n: int, wait_s: float) -> dict[str, object]:
    tasks = [bench.task() for _ in range(n)]
    waiters = [bench.watcher.expect(t.run_id or "") for t in tasks]
    msgs0, _ = await bench.stream_state()
    counts0 = Counter(bench.watcher.counts)
    cpu = CpuMeter(bench.log.nc)
    t0 = time.perf_counter()
    await asyncio.gather(*(bench.log.append(t) for t in tasks))
    submitted = time.perf_counter() - t0
    _, pending = await asyncio.wait(waiters, timeout=wait_s)
    wall = time.perf_counter() - t0
    cpu.stop()
    msgs1, _ = await bench.stream_state()
    arrivals = sorted(
        bench.watcher.arrived[k] - t0
        for k in (t.run_id or "" for t in tasks)
        if k in bench.watcher.arrived
    )
    if arrivals and not pending:
        wall = arrivals[-1]  # the last terminal event, not our wake-up
    counts = Counter(bench.watcher.counts)
    counts.subtract(counts0)
    return {
        "tasks": tasks,
        "wall": wall,
        "submitted": submitted,
        "lost": len(pending),
        "events": msgs1 - msgs0,
        "arrivals": arrivals,
        "counts": {k: v for k, v in counts.items() if v},
        "cpu": cpu,
    }


def _type_of(bench: AgentBench, data: bytes, subject: str) -> str:
    try:
        return bench.log.decode(data, subject=subject).type
    except EventDecodeError:
        return "<undecodable>"


async def verify(bench: AgentBench, tasks: list) -> tuple[int, Counter[str]]:  # type: ignore[type-arg]
    """How many runs have exactly the one-tool event sequence; what the others look like."""
    ok = 0
    odd: Counter[str] = Counter()
    reader = DirectReader(bench.log.nc, bench.log.cfg.log_stream)  # no consumer per run
    for t in tasks:
        raws = await reader.after(bench.log.subjects.run(t.run_id or ""), 0)
        types = [_type_of(bench, r.data, r.subject) for r in raws]
        types = [t for t in types if t not in BESIDE_THE_FLOW]
        if types == ONE_TOOL_FLOW:
            ok += 1
        else:
            extra = Counter(types)
            extra.subtract(Counter(ONE_TOOL_FLOW))
            odd[" ".join(f"{k}{v:+d}" for k, v in sorted(extra.items()) if v) or "reordered"] += 1
    return ok, odd


async def one_round(
    bench: AgentBench, label: str, inflight: int, wait_s: float
) -> tuple[bool, float, float]:
    """Run and report one round; returns (every run completed with the one-tool flow, runs/s,
    seconds from submitting to the first completion)."""
    reads = _direct_reads()
    res = await burst(bench, inflight, wait_s)
    reads = _direct_reads() - reads
    bench.last_tasks = res["tasks"]  # type: ignore[attr-defined]
    wall = float(res["wall"])  # type: ignore[arg-type]
    counts: dict[str, int] = res["counts"]  # type: ignore[assignment]
    arrivals: list[float] = res["arrivals"]  # type: ignore[assignment]
    tasks = res["tasks"]
    ok, odd = await verify(bench, tasks)  # type: ignore[arg-type]
    # each run's first terminal event; the subscription also sees publishes the log refused
    # (a superseded decision) or dropped as duplicates, counted apart
    outcomes = Counter(
        bench.watcher.outcome.get(sanitize_token(t.run_id or ""), "none")
        for t in tasks  # type: ignore[attr-defined]
    )
    completed, failed = outcomes["completed"], outcomes["failed"]
    good = completed == inflight and not failed and not res["lost"] and ok == inflight
    print(
        f"{label}: {inflight} runs in flight · {inflight / wall:6.1f} runs/s · "
        f"{int(res['events']) / wall:7.0f} events/s ({res['events']} events in "  # type: ignore[call-overload]
        f"{wall:.2f} s; submitting took {float(res['submitted']) * 1000:.0f} ms)"  # type: ignore[arg-type]
    )
    if arrivals:
        print(
            f"  completion times from submit: first {arrivals[0] * 1000:.0f} ms · "
            f"p50 {pct(arrivals, 50) * 1000:.0f} ms · last {arrivals[-1] * 1000:.0f} ms"
        )
    print(f"  {res['cpu'].report(inflight)}".replace("\n", "\n  "))  # type: ignore[attr-defined]
    print(f"  direct reads of runs the process-wide run feed did not hold: {reads / inflight:.2f} "
          "per run (each scans the log from where it starts: costlier the more runs interleave)")
    print(
        f"  check: completed {completed} / {inflight}, failed {failed}, "
        f"no terminal event {res['lost']}, exact one-tool flow {ok} / {inflight}"
        + (f", other shapes {dict(odd)}" if odd else "")
        + f" (terminal publishes seen: {dict(counts)})"
        + (" · OK" if good else " · LOST OR BROKEN RUNS")
    )
    return good, inflight / wall, arrivals[0] if arrivals else float("inf")


def _direct_reads() -> int:
    """Reads of whole runs (or their gaps) from the log so far, by every run feed here."""
    return sum(feed.reads for feed in runloader._feeds.values())


async def first_timeline(bench: AgentBench, tasks: list) -> None:  # type: ignore[type-arg]
    """Print the events of the run that completed first, by event time from its task: which
    handler's hop a burst held up."""
    done = [(bench.watcher.arrived[k], t) for t in tasks
            if (k := sanitize_token(t.run_id or "")) in bench.watcher.arrived]  # fmt: skip
    if not done:
        return
    _, task = min(done, key=lambda d: d[0])
    print(f"  the first run to complete ({task.run_id}), event time from its task:")
    for s in await read_run(bench.log, task.run_id or ""):
        if s.event is not None:
            at = (s.event.time - task.time).total_seconds() * 1000
            print(f"    {at:9.1f} ms  {s.event.type:<24} by {s.event.source}")


async def main(
    inflight: int, rounds: int, warmup: int, wait_s: float, projections: str, big: int
) -> None:
    config = "bare" if projections != "production" else "production"
    print(f"machine: {machine()} · config: {config} · projections: {projections}")
    print(calibration())
    async with agent_bench("throughput", projections=projections, config=config) as bench:
        await burst(bench, warmup, wait_s)
        all_good = True
        rates = []
        for r in range(1, rounds + 1):
            good, rate, _ = await one_round(bench, f"round {r}", inflight, wait_s)
            all_good &= good
            rates.append(rate)
        if big:
            good, _, first = await one_round(bench, "burst", big, wait_s)
            all_good &= good
            await first_timeline(bench, bench.last_tasks)  # type: ignore[attr-defined]
            print(
                f"  burst of {big}: first completion after {first:.2f} s · target <= 2 s · "
                + ("OK" if first <= 2 and good else "MISSED")
            )
        stats = {rt.durable: (rt.processed, rt.superseded, rt.dead_lettered)
                 for rt in bench.host.runtimes}  # fmt: skip
        print(
            "handlers (processed, superseded decisions, dead letters): "
            + ", ".join(f"{k} {v}" for k, v in stats.items())
        )
        dead = sum(v[2] for v in stats.values())
        if rates:
            print(
                f"throughput, {inflight} runs in flight: {sorted(rates)[len(rates) // 2]:.1f} "
                f"runs/s median of {rounds} rounds (best {max(rates):.1f}) · target >= 150"
            )
        print("no run lost, none failed" if all_good and not dead else "RUNS LOST/FAILED")
    print(f"at the end: {calibration()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inflight", type=int, default=100, help="runs submitted at once per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=20, help="runs in the warm-up round")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait per round")
    ap.add_argument(
        "--burst",
        type=int,
        default=0,
        help="then one round with this many runs in flight (1000: none lost, the first "
        "completes within 2 s)",
    )
    ap.add_argument(
        "--projections",
        choices=("production", "all", "sessions", "none"),
        default="production",
        help="production (default): what `nanocrab up` runs (nkeys, default policy, console "
        "tracing, every projection in the worker process); all/sessions/none: the bare "
        "diagnosis set-up with those SQL projections",
    )
    a = ap.parse_args()
    asyncio.run(main(a.inflight, a.rounds, a.warmup, a.timeout, a.projections, a.burst))
