"""Failover of the scaled-out deployment, as processes on loopback (tests/scale_rig.py).

A three-node NATS cluster with R3 streams, PostgreSQL, two ``nanocrab handler`` processes of
each agent-loop handler (every host holding only its own seed) and one projector. While runs are
in flight: ``kill -9`` the log stream's leader node, then one instance of each handler, then the
projector (started again afterwards). Every run must complete, nothing may be dead-lettered (a
read or an append the outage failed is retried, tests/test_runtime_bus_failures.py), no tool
call may start twice (the executor's interrupted-call rule holds across instances: a redelivered
``tool.requested`` whose ``tool.started`` is in the log is never run again), the projections must
equal a fresh rebuild, and ``nanocrab status`` must show the cluster's health during the outage
and after.

NANOCRAB_FAILOVER_RUNS runs (default the issue's 200: about a minute on a 2-core machine).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import postgres_reachable
from tests.scale_rig import (
    LOOP_HANDLERS,
    Topology,
    assert_each_call_ran_once,
    assert_projections_equal_a_rebuild,
    dead_letters,
    progress,
    running_topology,
    status_json,
    tool_calls,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.timeout(420),
    pytest.mark.skipif(not postgres_reachable(), reason="PostgreSQL not reachable on :5432"),
]

RUNS = int(os.environ.get("NANOCRAB_FAILOVER_RUNS", "200"))


async def test_runs_survive_a_node_a_handler_instance_and_the_projector_dying(
    tmp_path: Path,
) -> None:
    async with running_topology(tmp_path, ack_wait_s=4.0) as topo:
        await _scenario(topo)


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

    # nothing was given up on: a read or an append the outage failed is retried, never
    # dead-lettered (the cause of the runs that stopped here before)
    assert await dead_letters(topo) == []

    # no tool call started twice; every call completed once
    assert_each_call_ran_once(await tool_calls(topo, runs), runs)

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
    await assert_projections_equal_a_rebuild(topo, at_least_rows=RUNS)
