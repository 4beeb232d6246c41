"""Failover of the scaled-out deployment, as processes on loopback (tests/scale_rig.py).

A three-node NATS cluster with R3 streams, PostgreSQL, two ``nanocrab handler`` processes of
each agent-loop handler (every host holding only its own seed) and one projector. While runs are
in flight: ``kill -9`` the log stream's leader node, then one instance of each handler, then the
projector (started again afterwards). Every run must complete, no tool call may start twice (the
executor's interrupted-call rule holds across instances: a redelivered ``tool.requested`` whose
``tool.started`` is in the log is never run again), the projections must equal a fresh rebuild,
and ``nanocrab status`` must show the cluster's health during the outage and after.

Sized for a 2-core machine: NANOCRAB_FAILOVER_RUNS runs (default 60; the issue's 200 take
proportionally longer, see docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import nats.errors
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import BusError, Window, read
from nanocrab.events import GrantIssued, ToolCompleted, ToolRequested, ToolStarted
from nanocrab.projections import Projector, all_projections, make_engine
from tests.conftest import postgres_reachable
from tests.scale_rig import LOOP_HANDLERS, Topology, create_database, drop_database

pytestmark = [
    pytest.mark.slow,
    # Known, not yet fixed (docs/scaling.md, "Open"): after the stream leader's node is killed,
    # a run in a few hundred stops with an event acknowledged by its handler and no reaction
    # (seen at task.submitted, llm.requested and tool.requested; nothing pending or redelivered).
    # Stale follower reads were one cause and are fixed (need-reaching reads, leader-only reads
    # on a replicated log); what remains is not found. Not strict: a pass shows as XPASS.
    pytest.mark.xfail(strict=False, reason="a run may stop after a leader failover (issue 16)"),
    pytest.mark.postgres,
    pytest.mark.timeout(420),
    pytest.mark.skipif(not postgres_reachable(), reason="PostgreSQL not reachable on :5432"),
]

RUNS = int(os.environ.get("NANOCRAB_FAILOVER_RUNS", "60"))


def status_json(topo: Topology) -> dict[str, Any]:
    """``nanocrab status --json`` as the operator runs it (from the data dir holding the keys)."""
    out = subprocess.run(
        [sys.executable, "-m", "nanocrab", "status", "--json"], env=topo.env(topo.home),
        capture_output=True, text=True, timeout=120, cwd=topo.workspace,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


async def progress(topo: Topology, runs: list[str], at_least: int, timeout: float) -> int:
    """Wait until ``at_least`` of ``runs`` ended; returns how many have."""
    deadline = asyncio.get_running_loop().time() + timeout
    wanted = set(runs)
    while True:
        try:
            done = len(wanted & set(await topo.ended()))
        except (nats.errors.TimeoutError, BusError):  # a stream leader being elected: again
            done = 0
        if done >= at_least:
            return done
        if asyncio.get_running_loop().time() > deadline:
            stuck = await timelines(topo, wanted - set(await topo.ended()))
            log = await topo.cli_log()
            consumers = [
                (c.name, c.num_pending, c.num_ack_pending, c.num_redelivered)
                for c in await log.js.consumers_info(log.cfg.log_stream)
                if c.config.durable_name
            ]
            raise AssertionError(
                f"only {done}/{len(runs)} runs ended within {timeout}s: {stuck}; consumers "
                f"(name, pending, unacked, redelivered): {consumers}"
            )
        await asyncio.sleep(0.5)


async def timelines(topo: Topology, runs: set[str], limit: int = 3) -> dict[str, list[str]]:
    """The event types (with sources) of a few runs, for a failure message."""
    log = await topo.cli_log()
    out: dict[str, list[str]] = {}
    for run in sorted(runs)[:limit]:
        async for s in read(log, log.subjects.run(run), Window()):
            out.setdefault(run, []).append(
                f"{s.seq}:{s.event.type}/{s.event.source}" if s.event else f"{s.seq}:?"
            )
    return out


async def table_contents(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    async with engine.connect() as conn:
        for projection in all_projections():
            for table in projection.tables:
                order = list(table.primary_key.columns) or list(table.columns)
                rows = await conn.execute(select(table).order_by(*order))
                out[table.name] = [tuple(r) for r in rows]
    return out


async def test_runs_survive_a_node_a_handler_instance_and_the_projector_dying(
    tmp_path: Path,
) -> None:
    topo = Topology(tmp_path, ack_wait_s=4.0)
    await topo.start()
    try:
        await _scenario(topo)
    finally:
        await topo.stop()
        print(
            "\n".join(f"{p}: {topo.output(x)[-400:]}" for p, xs in topo.procs.items() for x in xs)
        )


async def _scenario(topo: Topology) -> None:
    assert topo.cluster is not None
    for name in LOOP_HANDLERS:
        topo.spawn(name)
        topo.spawn(name)
    projector = topo.spawn("projector")
    everyone = [p for ps in topo.procs.values() for p in ps]
    await topo.wait_ready(everyone, timeout=180)
    # an executor host holds its own seed and public keys only: no policy seed to mint grants
    executor_keys = sorted(p.name for p in (topo.host_home("executor") / "keys").iterdir())
    assert executor_keys == ["approver.pub", "executor.nk", "policy.pub"]

    runs = await topo.submit(RUNS, label=f"failover {uuid.uuid4().hex[:6]}")
    await progress(topo, runs, RUNS // 5, timeout=120)

    # 1. the log stream's leader node dies
    log = await topo.cli_log()
    leader = (await log.js.stream_info(log.cfg.log_stream)).cluster
    assert leader is not None and leader.leader
    topo.cluster.kill(leader.leader)
    during = status_json(topo)  # waits out the election of a new leader
    streams = {s["name"]: s for s in during["streams"]}
    health = streams[log.cfg.log_stream]["cluster"]
    assert health["leader"] and health["leader"] != leader.leader, health
    assert any(r["name"] == leader.leader and (r["offline"] or not r["current"])
               for r in health["replicas"]), health  # fmt: skip
    assert any(leader.leader in p for p in during["problems"]), during["problems"]

    # 2. one instance of each handler dies mid-work
    await progress(topo, runs, 2 * RUNS // 5, timeout=120)
    for name in LOOP_HANDLERS:
        topo.kill(topo.procs[name][0])

    # 3. the projector dies, and comes back (it resumes from its checkpoints)
    await progress(topo, runs, 3 * RUNS // 5, timeout=180)
    topo.kill(projector)
    replacement = topo.spawn("projector")
    await topo.wait_ready([replacement], timeout=120)

    # every run completes
    await progress(topo, runs, RUNS, timeout=150)
    ended = await topo.ended()
    assert {r: ended[r] for r in runs} == {r: "run.completed" for r in runs}

    # no tool call started twice; every call completed once
    started: collections.Counter[str] = collections.Counter()
    completed: collections.Counter[str] = collections.Counter()
    mine = set(runs)
    calls: dict[str, list[str]] = collections.defaultdict(list)
    async for s in read(log, log.subjects.log_all, Window()):
        e = s.event
        if e is None or e.run_id not in mine:
            continue
        if isinstance(e, ToolStarted | ToolCompleted | GrantIssued | ToolRequested):
            kind = getattr(e, "error_kind", "") or ""
            calls[e.call_id].append(f"{s.seq}:{e.type}/{e.source}{'/' + kind if kind else ''}")
        if isinstance(e, ToolStarted):
            started[e.call_id] += 1
        elif isinstance(e, ToolCompleted):
            completed[e.call_id] += 1
    twice = {c: calls[c] for c, n in (started + completed).items() if n > 2}
    assert started and max(started.values()) == 1, twice
    assert len(completed) == RUNS and max(completed.values()) == 1, twice

    # the node comes back and catches up: status shows a healthy cluster again
    await asyncio.to_thread(topo.cluster.restart, leader.leader)
    deadline = asyncio.get_running_loop().time() + 120
    while True:
        after = status_json(topo)
        health = {s["name"]: s["cluster"] for s in after["streams"]}[log.cfg.log_stream]
        caught_up = all(r["current"] and not r["offline"] for r in health["replicas"])
        behind = [p for p in after["projections"] if p["behind"]]
        if caught_up and not behind and not after["problems"]:
            break
        assert asyncio.get_running_loop().time() < deadline, (health, behind, after["problems"])
        await asyncio.sleep(1.0)
    assert len(health["replicas"]) == 2 and health["leader"]

    # projections equal a fresh rebuild from sequence 0
    live = make_engine(topo.db_url)
    fresh_name = f"{topo.db_name}_rebuild"
    fresh = make_engine(await create_database(fresh_name))
    try:
        for projection in all_projections():
            await Projector(log, fresh, projection).rebuild()
        projected, rebuilt = await table_contents(live), await table_contents(fresh)
        assert sum(len(v) for v in projected.values()) > RUNS
        assert projected == rebuilt
    finally:
        await live.dispose()
        await fresh.dispose()
        await drop_database(fresh_name)
