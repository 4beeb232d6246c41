"""Shared set-up for benchmarks: a private embedded nats-server and a fresh subject root."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from nanocrab.bus import BusConfig, EmbeddedServer, EventLog, connect
from nanocrab.bus.server import free_port


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


@contextlib.asynccontextmanager
async def bench_log(name: str) -> AsyncIterator[tuple[EventLog, Path]]:
    with tempfile.TemporaryDirectory(prefix=f"nanocrab-bench-{name}-") as tmp:
        server = EmbeddedServer(Path(tmp), port=free_port())
        url = server.start()
        nc = await connect(url, name=f"bench-{name}")
        try:
            cfg = BusConfig(url=url, data_dir=Path(tmp), root=f"b{uuid.uuid4().hex[:8]}")
            yield await EventLog.open(nc, cfg), Path(tmp)
        finally:
            await nc.drain()
            server.stop()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary_ms(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"p50 {pct(ms, 50):.3f} ms · p99 {pct(ms, 99):.3f} ms · "
        f"mean {statistics.fmean(ms):.3f} ms · max {max(ms):.3f} ms"
    )
