"""Soak: memory stays flat over thousands of tasks (issue 10, bug 7).

The agent loop as ``nanocrab up`` runs it: the handlers in one process (orchestrator, policy,
executor, LLM handler, default ``RuntimeOptions``), every projection on SQLite in its worker
process, a private embedded nats-server, the scripted model, each run one ``read`` of a 10-line
file then an answer. Tasks go in ``--inflight`` at a time (each in its own session, as separate
users would send them); after every ``--every`` tasks the RSS of this process and the worker is
sampled (after a full collection). Run with the projectors in a thread of this process instead
(the ``Host`` default), they fall behind at this rate (~120 tasks/s here), their feed buffers
(8 batches per projection) fill and the sum grows for that reason: it measured +72 to +108 %.

Passes when RSS after the last task is within ``--tolerance`` (10 %) of RSS after task
``--baseline`` (500): caches fill up during the first hundreds of tasks, then must stay bounded.
Prints the RSS series and the in-memory sizes of the handlers' caches at the end.

Usage: .venv/bin/python bench/soak.py [--tasks 2000] [--baseline 500] [--inflight 20]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

import psutil

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _agent import NOTES, ONE_TOOL_SCRIPT, RunWatcher, build_reactors
from _common import bench_log, machine

from nanocrab.bus import RuntimeOptions
from nanocrab.cli.host import Host
from nanocrab.events import TaskSubmitted, new_event_id
from nanocrab.llm import ScriptedProvider
from nanocrab.projections import all_projections, default_url, make_engine


def rss_mb() -> float:
    """This process's RSS and its children's (the projection worker; not nats-server)."""
    gc.collect()
    me = psutil.Process()
    procs = [me, *(c for c in me.children(recursive=True) if "nats-server" not in c.name())]
    return sum(p.memory_info().rss for p in procs) / 2**20


def task(workspace: Path) -> TaskSubmitted:
    rid = new_event_id()
    return TaskSubmitted(
        text="what is in notes.txt?", run_id=rid, task_id=rid, workspace=str(workspace),
        session_id=new_event_id(),
    )  # fmt: skip


def cache_sizes(host: Host) -> dict[str, int]:
    """Entries held in memory per handler cache (the ones bug 7 bounds)."""
    out: dict[str, int] = {}
    for r in host.reactors:
        for attr, value in vars(r).items():
            if isinstance(value, dict | set | list) and attr not in ("consumes",):
                out[f"{r.name}.{attr}"] = len(value)
            loader = getattr(value, "_cache", None)
            if isinstance(loader, dict):
                out[f"{r.name}.{attr}._cache"] = len(loader)
    return {k: v for k, v in out.items() if v}


async def main(tasks: int, baseline: int, inflight: int, every: int, tolerance: float) -> int:
    print(f"soak: {tasks} tasks, {inflight} in flight · {machine()}")
    async with bench_log("soak") as (log, tmp):
        workspace = tmp / "ws"
        workspace.mkdir()
        (workspace / "notes.txt").write_text(NOTES)
        engine = make_engine(default_url(tmp))
        provider = ScriptedProvider.from_text(ONE_TOOL_SCRIPT)
        host = Host(
            log,
            engine,
            build_reactors(log, engine, provider, workspace),
            projections=all_projections(),
            options=RuntimeOptions(),
            projectors_in="process",  # as `nanocrab up` runs them
        )
        watcher = RunWatcher(log)
        await watcher.start()
        await host.start()
        series: list[tuple[int, float]] = [(0, rss_mb())]
        done = failed = 0
        t0 = time.perf_counter()
        try:
            while done < tasks:
                batch = [task(workspace) for _ in range(min(inflight, tasks - done))]
                waiters = [watcher.expect(t.run_id or "") for t in batch]
                await asyncio.gather(*(log.append(t) for t in batch))
                await asyncio.wait_for(asyncio.gather(*waiters), 120)
                failed += sum(watcher.result(t.run_id or "")[1] != "completed" for t in batch)
                for t in batch:  # the watcher is ours, not the host's: keep it from growing
                    key = (t.run_id or "").lower()
                    for d in (watcher.arrived, watcher.outcome, watcher._waiters):
                        d.pop(key, None)
                        d.pop(t.run_id or "", None)
                done += len(batch)
                if done % every == 0 or done == tasks:
                    series.append((done, rss_mb()))
                    rate = done / (time.perf_counter() - t0)
                    print(f"  task {done:>5}: RSS {series[-1][1]:7.1f} MB  ({rate:.1f} tasks/s)",
                          flush=True)  # fmt: skip
        finally:
            sizes = cache_sizes(host)
            await watcher.stop()
            await host.stop(drain_s=10)
            await engine.dispose()
    at = dict(series)
    base = at.get(baseline) or min(series, key=lambda p: abs(p[0] - baseline))[1]
    last = series[-1][1]
    growth = (last - base) / base
    print("RSS series (task, MB): " + ", ".join(f"({n}, {mb:.1f})" for n, mb in series))
    print(f"caches at the end: {sizes}")
    print(f"failed runs: {failed}")
    verdict = "PASS" if growth <= tolerance and not failed else "FAIL"
    print(
        f"{verdict}: RSS after task {series[-1][0]} is {last:.1f} MB, after task {baseline} "
        f"{base:.1f} MB: {growth * 100:+.1f} % (limit {tolerance * 100:.0f} %); "
        f"{(last - base) * 1024 / max(1, series[-1][0] - baseline):.1f} KB per task"
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--baseline", type=int, default=500)
    ap.add_argument("--inflight", type=int, default=20)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--tolerance", type=float, default=0.10)
    a = ap.parse_args()
    sys.exit(asyncio.run(main(a.tasks, a.baseline, a.inflight, a.every, a.tolerance)))
