"""Scaling: runs/s and CPU per run with 1, 2 and 4 processes per handler type on a three-node
NATS cluster (R3 streams, PostgreSQL projections), and the embedded single-process figure.

Each configuration is the topology of tests/scale_rig.py (what compose.yaml describes, as
processes on loopback): ``nanocrab handler NAME`` processes for the agent loop (orchestrator,
policy, executor, llm; guardrails off, no routing) and one projector. The embedded figure is
``nanocrab up`` (one process, the embedded nats-server, projections on SQLite in a child
process). Every run is the same one-tool script (``write``, then an answer) of the offline model.

Measured: wall time from the first submit to the last ``run.completed`` (runs/s), and the CPU
time (user + system) every process of the deployment spent meanwhile — handlers, projector and
nats-server nodes — per run. Start-up and a warm-up batch are excluded.

    .venv/bin/python bench/scaling.py --procs 1,2,4 --runs 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanocrab.bus import BusConfig, Connector, EventLog, Window, read
from nanocrab.bus.permissions import CLI
from nanocrab.cli.agent import new_task
from nanocrab.cli.host import seed_source
from nanocrab.security import KeyRing
from tests.scale_rig import LOOP_HANDLERS, Topology

STALL_S = 20.0
"""A configuration whose runs stop completing for this long is reported with what completed."""


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU of these processes and their children (gone ones count 0)."""
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


async def completed(log: EventLog, runs: set[str]) -> int:
    done = set()
    async for s in read(log, log.subjects.of_type("run.completed"), Window()):
        if s.event is not None and s.event.run_id in runs:
            done.add(s.event.run_id)
    return len(done)


async def measure(
    log: EventLog, workspace: Path, runs: int, pids: Callable[[], list[int]], label: str
) -> dict[str, float]:
    """Warm up, then submit ``runs`` runs at once and wait for all of them."""
    warm = [new_task(f"warm {i}", "default", None, workspace=workspace) for i in range(4)]
    for e in warm:
        await log.append(e)
    while await completed(log, {e.run_id for e in warm}) < len(warm):  # noqa: ASYNC110  (the log is polled)
        await asyncio.sleep(0.2)
    tasks = [new_task(f"{label} {i}", "default", None, workspace=workspace) for i in range(runs)]
    cpu0, t0 = cpu_seconds(pids()), time.monotonic()
    for e in tasks:
        await log.append(e)
    wanted = {e.run_id for e in tasks}
    done, last, moved = 0, 0, time.monotonic()
    while done < runs and time.monotonic() - moved < STALL_S:
        await asyncio.sleep(0.2)
        done = await completed(log, wanted)
        if done > last:
            last, moved = done, time.monotonic()
    wall, cpu = moved - t0, cpu_seconds(pids()) - cpu0
    if done < runs:
        print(f"  {runs - done} of {runs} runs never completed (no progress for {STALL_S:.0f} s)")
    runs = max(done, 1)
    return {
        "runs": runs,
        "wall_s": wall,
        "runs_per_s": runs / wall,
        "cpu_ms_per_run": 1000 * cpu / runs,
    }


async def clustered(per_handler: int, runs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="nanocrab-scaling-") as tmp:
        topo = Topology(Path(tmp))
        await topo.start()
        try:
            for name in LOOP_HANDLERS:
                for _ in range(per_handler):
                    topo.spawn(name)
            topo.spawn("projector")
            await topo.wait_ready([p for ps in topo.procs.values() for p in ps], timeout=600)
            assert topo.cluster is not None
            cluster = topo.cluster

            def pids() -> list[int]:
                procs = [p.pid for ps in topo.procs.values() for p in ps]
                return procs + list(cluster.pids().values())

            result = await measure(await topo.cli_log(), topo.workspace, runs, pids, "scaling")
            result["processes_per_handler"] = per_handler
            return result
        finally:
            await topo.stop()


def launch(cwd: Path, env: dict[str, str], log_file: Path) -> subprocess.Popen[bytes]:
    """``nanocrab up`` in ``cwd``, its output to ``log_file``."""
    with log_file.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "nanocrab", "up"], cwd=cwd, env=env, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


async def embedded(runs: int) -> dict[str, float]:
    """``nanocrab up``: every handler in one process, the embedded server, SQLite."""
    with tempfile.TemporaryDirectory(prefix="nanocrab-scaling-up-") as tmp:
        topo = Topology(Path(tmp))  # only for its workspace, script and environment
        topo.workspace.mkdir(parents=True)
        (topo.workspace / "notes.txt").write_text("hello\n")
        from tests.scale_rig import POLICY, SCRIPT

        (topo.root / "script.yaml").write_text(SCRIPT)
        (topo.root / "policy.yaml").write_text(POLICY)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NANOCRAB_")}
        env.update(
            NANOCRAB_HOME=str(topo.home), NANOCRAB_TRACES="none", NANOCRAB_PROVIDER="scripted",
            NANOCRAB_SCRIPT=str(topo.root / "script.yaml"), NANOCRAB_GUARDRAILS="none",
            NANOCRAB_RECALL="off", NANOCRAB_POLICY=str(topo.root / "policy.yaml"),
        )  # fmt: skip
        env.pop("ANTHROPIC_API_KEY", None)
        up = launch(topo.workspace, env, topo.root / "up.log")
        connector = None
        try:
            while "nanocrab up" not in (topo.root / "up.log").read_text(errors="replace"):
                if up.poll() is not None:
                    raise RuntimeError((topo.root / "up.log").read_text())
                await asyncio.sleep(0.2)
            url = json.loads((topo.home / "nats" / "server.json").read_text())["url"]
            cfg = BusConfig(url=url, data_dir=topo.home, auth=True)
            seeds = seed_source(KeyRing(topo.home / "keys"), create=False)
            connector = Connector(url, cfg, seeds=seeds, name="bench-scaling")
            log = await connector.open(CLI)
            result = await measure(log, topo.workspace, runs, lambda: [up.pid], "embedded")
            result["processes_per_handler"] = 0
            return result
        finally:
            if connector is not None:
                await connector.close()
            up.terminate()
            await asyncio.to_thread(up.wait, 60)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", default="1,2,4", help="processes per handler type")
    parser.add_argument("--runs", type=int, default=60, help="runs per configuration")
    parser.add_argument("--no-embedded", action="store_true")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; {args.runs} runs per configuration (one write call each)")
    print(f"{'configuration':<34} {'runs/s':>8} {'CPU ms/run':>11} {'wall s':>7}")
    rows = []
    if not args.no_embedded:
        rows.append(("embedded: nanocrab up (1 process)", await embedded(args.runs)))
        r = rows[-1][1]
        print(f"{rows[-1][0]:<34} {r['runs_per_s']:>8.1f} {r['cpu_ms_per_run']:>11.1f} "
              f"{r['wall_s']:>7.1f}", flush=True)  # fmt: skip
    for n in [int(x) for x in args.procs.split(",")]:
        label = f"3-node R3 cluster, {n} proc/handler"
        rows.append((label, await clustered(n, args.runs)))
        r = rows[-1][1]
        print(f"{label:<34} {r['runs_per_s']:>8.1f} {r['cpu_ms_per_run']:>11.1f} "
              f"{r['wall_s']:>7.1f}", flush=True)  # fmt: skip
    print(json.dumps([{"configuration": k, **v} for k, v in rows]))


if __name__ == "__main__":
    asyncio.run(main())
