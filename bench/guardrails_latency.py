"""What the guardrails add to the one-tool run, stage by stage: with the chain off, with the
bundled chain waiting for every verdict, and with the bundled chain pre-screening.

Runs the production set-up of ``bench/agent_latency.py`` (``_agent.agent_bench``: embedded
nats-server under broker permissions, every handler on its own identity, projections in their
worker, the scripted one-tool model) three times in one process — ``none``
(``NANOCRAB_GUARDRAILS=none``), ``wait`` (the bundled chain, pre-screening switched off: the
orchestrator waits for each verdict, as before) and ``prescreen`` (the bundled chain as
shipped) — alternating short rounds so that the machine's drifting load hits all three alike.

For every measured run it reads the run back and reports, as medians over runs, the end-to-end
time and the four gaps the guardrails sit in, from JetStream's storage timestamps:
``task.submitted → llm.requested`` (task_input), ``llm.responded → tool.requested``
(tool_call), ``tool.completed → llm.requested`` (tool_output), ``llm.responded → reply.sent``
(reply). A gap is what the run waited there, whatever the machine's speed elsewhere.

Usage: PYTHONPATH=. .venv/bin/python bench/guardrails_latency.py [--rounds 3] [--runs 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _agent import agent_bench
from _common import pct

from nanocrab.bus import read_run
from nanocrab.handlers import guardrails as guardrails_handler

GAPS = {
    "task_input": ("task.submitted", "llm.requested"),
    "tool_call": ("llm.responded", "tool.requested"),
    "tool_output": ("tool.completed", "llm.requested"),
    "reply": ("llm.responded", "reply.sent"),
}


def _gaps(stored: list) -> dict[str, float]:  # type: ignore[type-arg]
    """The four gaps of one run in ms (the first occurrence of each pair, in log order)."""
    events = [(s.event.type, s.stored_ns) for s in stored if s.event is not None]
    out: dict[str, float] = {}
    for name, (first, then) in GAPS.items():
        for i, (etype, ns) in enumerate(events):
            if etype != first or (name == "reply" and i < len(events) // 2):
                continue  # the reply's llm.responded is the second one
            if name == "tool_output" and not any(t == "tool.completed" for t, _ in events[: i + 1]):
                continue
            nxt = next((n for t, n in events[i + 1 :] if t == then), None)
            if nxt is not None:
                out[name] = (nxt - ns) / 1e6
                break
    return out


async def _round(mode: str, runs: int, warmup: int) -> tuple[list[float], dict[str, list[float]]]:
    if mode == "none":
        os.environ["NANOCRAB_GUARDRAILS"] = "none"
    else:
        os.environ.pop("NANOCRAB_GUARDRAILS", None)
    saved = (guardrails_handler.Prescreener.event, guardrails_handler.Prescreener.outputs)
    if mode == "wait":
        guardrails_handler.Prescreener.event = lambda self, state, event: None  # type: ignore[method-assign]
        guardrails_handler.Prescreener.outputs = lambda self, state: None  # type: ignore[method-assign]
    totals: list[float] = []
    gaps: dict[str, list[float]] = defaultdict(list)
    try:
        async with agent_bench(f"guardrails-latency-{mode}", config="production") as bench:
            measured: list[str] = []
            for i in range(runs + warmup):
                task = bench.task()
                secs, _ = await bench.run_one(task)
                if i >= warmup:
                    totals.append(secs * 1000)
                    measured.append(task.run_id or "")
            for rid in measured:
                for name, ms in _gaps(await read_run(bench.log, rid)).items():
                    gaps[name].append(ms)
    finally:
        guardrails_handler.Prescreener.event, guardrails_handler.Prescreener.outputs = saved
    return totals, gaps


async def main(rounds: int, runs: int, warmup: int) -> None:
    totals: dict[str, list[float]] = defaultdict(list)
    gaps: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in range(rounds):
        for mode in ("none", "wait", "prescreen"):
            t, g = await _round(mode, runs, warmup)
            totals[mode] += t
            for name, values in g.items():
                gaps[mode][name] += values
            print(f"round {r + 1} {mode:9} p50 {statistics.median(t):7.1f} ms  "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    print(f"\n{rounds} rounds x {runs} runs per mode ({warmup} warm-up runs excluded per round)")
    header = f"{'mode':10} {'run p50':>9} {'run p99':>9}" + "".join(f" {g:>12}" for g in GAPS)
    print(header + "   (gap medians, ms, from JetStream storage times)")
    for mode in ("none", "wait", "prescreen"):
        line = f"{mode:10} {statistics.median(totals[mode]):9.1f} {pct(totals[mode], 99):9.1f}"
        for name in GAPS:
            values = gaps[mode].get(name, [])
            line += f" {statistics.median(values):12.2f}" if values else f" {'-':>12}"
        print(line)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    asyncio.run(main(args.rounds, args.runs, args.warmup))
