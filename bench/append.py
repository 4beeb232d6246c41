"""Append throughput and latency on the embedded server.

Prints: one-at-a-time awaited append latency (p50/p99) and rate, and pipelined batch append rate.
Usage: python bench/append.py [--single N] [--pipelined N] [--batch B]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _common import bench_log, machine, summary_ms

from nanocrab.events import Codec, ReplySent


def make(i: int) -> ReplySent:
    return ReplySent(text=f"reply number {i:08d}", run_id=f"run{i % 100:04d}", source="bench")


async def main(single: int, pipelined: int, batch: int) -> None:
    size = len(Codec().encode(make(0), subject="x"))
    print(f"machine: {machine()} · event size ~{size} bytes (CloudEvents JSON)")
    async with bench_log("append") as (log, _):
        for i in range(200):  # warm-up
            await log.append(make(i))
        lat: list[float] = []
        start = time.perf_counter()
        for i in range(single):
            t = time.perf_counter()
            await log.append(make(i))
            lat.append(time.perf_counter() - t)
        took = time.perf_counter() - start
        print(f"single awaited append: {single / took:,.0f} events/s · {summary_ms(lat)}")

        events = [make(i) for i in range(pipelined)]
        start = time.perf_counter()
        for i in range(0, pipelined, batch):
            await log.append_batch(events[i : i + batch])
        took = time.perf_counter() - start
        print(
            f"pipelined append_batch({batch}): {pipelined / took:,.0f} events/s "
            f"({pipelined} events in {took:.2f}s) · target >= 25,000"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--single", type=int, default=5000)
    ap.add_argument("--pipelined", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    a = ap.parse_args()
    asyncio.run(main(a.single, a.pipelined, a.batch))
