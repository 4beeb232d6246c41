"""Projection rebuild rate: N events in the log → the run timeline in SQLite, from sequence 0.

Usage: python bench/rebuild.py [--events N] [--db URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import bench_log, machine

from nanocrab.events import ReplySent, RunStarted
from nanocrab.projections import Projector, RunTimelineProjection, make_engine


async def main(n: int, db: str | None) -> None:
    print(f"machine: {machine()}")
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
        await projector.setup()
        t = time.perf_counter()
        applied = await projector.rebuild()
        took = time.perf_counter() - t
        await engine.dispose()
        print(
            f"rebuild into {engine.dialect.name}: {applied:,} events in {took:.2f}s = "
            f"{applied / took:,.0f} events/s · target >= 40,000"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--db", default=None)
    a = ap.parse_args()
    asyncio.run(main(a.events, a.db))
