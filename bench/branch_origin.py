"""Cost of telling whether a session is a branch: ``nanocrab.branching.origin_of`` (one direct
get of the first ``session.branched`` on the session's subject), done once per session and
process by the LLM handler's session index (``handlers/branches.py``, cached after).

A private embedded nats-server; 20,000 other events on the log first; then 2,000 lookups of
sessions that are no branch (each a different id, as new sessions are) and 2,000 of one that is.

Usage: .venv/bin/python bench/branch_origin.py
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from nanocrab.branching import origin_of
from nanocrab.bus import BusConfig, EmbeddedServer, EventLog, connect
from nanocrab.bus.server import free_port
from nanocrab.events import RunStarted, SessionBranched


async def main() -> None:
    d = Path(tempfile.mkdtemp())
    server = EmbeddedServer(d / "nats", port=free_port())
    url = server.start()
    try:
        nc = await connect(url, name="bench")
        log = await EventLog.open(nc, BusConfig(url=url, data_dir=d, root="bench"))
        for i in range(20_000):
            await log.append_nowait(RunStarted(run_id=f"r{i % 500}", session_id=f"s{i}"))
        await log.append(
            SessionBranched(parent_run_id="r1", at_event_id="x", at_seq=5, session_id="b1")
        )
        for label in ("not a branch", "a branch"):
            times = []
            for i in range(2_000):
                started = time.perf_counter()
                await origin_of(log, "b1" if label == "a branch" else f"n{i}")
                times.append(time.perf_counter() - started)
            times.sort()
            print(
                f"origin_of ({label}): median {statistics.median(times) * 1e3:.3f} ms, "
                f"p99 {times[int(len(times) * 0.99)] * 1e3:.3f} ms over {len(times)}"
            )
        await nc.drain()
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
