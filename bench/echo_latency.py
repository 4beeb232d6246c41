"""End-to-end echo latency: task.submitted appended → run.completed seen by a subscriber.

The echo handler runs on its durable pull consumer in this process; the observer is a plain NATS
subscription on the run.completed subjects (what an external consumer would use).
Usage: python bench/echo_latency.py [--runs N]
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

from nanocrab.bus import HandlerRuntime
from nanocrab.events import TaskSubmitted
from nanocrab.handlers.echo import EchoReactor


async def main(runs: int) -> None:
    print(f"machine: {machine()}")
    async with bench_log("echo") as (log, _):
        runtime = HandlerRuntime(log, EchoReactor())
        task = asyncio.create_task(runtime.run())
        arrived: dict[str, float] = {}
        waiters: dict[str, asyncio.Event] = {}

        async def on_completed(msg) -> None:  # type: ignore[no-untyped-def]
            run_id = msg.subject.split(".")[3]
            arrived[run_id] = time.perf_counter()
            if run_id in waiters:
                waiters[run_id].set()

        sub = await log.nc.subscribe(f"{log.cfg.root}.*.run.*.run.completed", cb=on_completed)
        lat: list[float] = []
        for i in range(runs + 50):
            rid = f"r{i:06d}"
            waiters[rid] = asyncio.Event()
            t = time.perf_counter()
            await log.append(TaskSubmitted(text="ping", run_id=rid))
            await asyncio.wait_for(waiters[rid].wait(), 10)
            if i >= 50:  # warm-up excluded
                lat.append(arrived[rid] - t)
        print(
            f"echo run end to end ({runs} sequential runs): {summary_ms(lat)} · "
            "target p50 <= 3 ms, p99 <= 10 ms"
        )
        await sub.unsubscribe()
        runtime.stop()
        await task


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    asyncio.run(main(ap.parse_args().runs))
