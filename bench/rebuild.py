"""Projection rebuild rate: N events in the log → the run timeline in SQLite, from sequence 0.

The catch-up reads the log in a process of its own (projections/_reader.py) while this one
decodes and writes; ``--read-here`` reads it in this process instead, as before, for comparison.
CPU is reported per process: this one (decode + write) and the reader; nats-server's is apart.

Usage: python bench/rebuild.py [--events N] [--db URL] [--read-here]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from pathlib import Path

import psutil

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _common import bench_log, machine

from nanocrab.events import ReplySent, RunStarted
from nanocrab.projections import Projector, RunTimelineProjection, make_engine


async def main(n: int, db: str | None, read_here: bool) -> None:
    print(f"machine: {machine()} · load {os.getloadavg()[0]:.2f}")
    async with bench_log("rebuild") as (log, tmp):
        t = time.perf_counter()
        for i in range(0, n, 1000):
            await log.append_batch([
                (RunStarted if j % 2 else ReplySent)(run_id=f"run{j // 4:06d}", source="bench",
                                                     **({} if j % 2 else {"text": f"reply {j}"}))
                for j in range(i, min(n, i + 1000))
            ])  # fmt: skip
        print(f"seeded {n:,} events in {time.perf_counter() - t:.1f}s")
        engine = make_engine(db or f"sqlite+aiosqlite:///{tmp / 'rebuild.db'}")
        projector = Projector(log, engine, RunTimelineProjection())
        if read_here:
            projector.reader_process_min = n + 1
        await projector.setup()
        server = _nats_server()
        t, cpu, reader = time.perf_counter(), time.process_time(), _children_cpu()
        nats = _cpu(server)
        applied = await projector.rebuild()
        took, cpu = time.perf_counter() - t, time.process_time() - cpu
        reader, nats = _children_cpu() - reader, _cpu(server) - nats
        await engine.dispose()
        print(
            f"rebuild into {engine.dialect.name} (read {'here' if read_here else 'apart'}): "
            f"{applied:,} events in {took:.2f}s = {applied / took:,.0f} events/s · target >= "
            f"60,000 · CPU µs/event: this process {cpu / max(applied, 1) * 1e6:.1f}, "
            f"reader process {reader / max(applied, 1) * 1e6:.1f}, nats-server "
            f"{nats / max(applied, 1) * 1e6:.1f} · {os.cpu_count()} cores"
        )


def _nats_server() -> psutil.Process | None:
    """The embedded nats-server this bench started (a child of this process)."""
    found = [p for p in psutil.Process().children() if "nats-server" in p.name()]
    return found[0] if found else None


def _cpu(proc: psutil.Process | None) -> float:
    if proc is None:
        return 0.0
    times = proc.cpu_times()
    return times.user + times.system


def _children_cpu() -> float:
    """CPU seconds of the child processes ended so far (the reader; nats-server ends later)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--db", default=None)
    ap.add_argument("--read-here", action="store_true", help="read the log in this process")
    a = ap.parse_args()
    asyncio.run(main(a.events, a.db, a.read_here))
