"""Rolling restart of the scaled-out deployment under load, as processes on loopback
(tests/scale_rig.py).

A three-node NATS cluster with R3 streams, PostgreSQL, two ``nanocrab handler`` processes of
each agent-loop handler and one projector. While new runs keep arriving, every handler process
is restarted in turn, one instance at a time (SIGTERM, as an orchestrator such as Compose or
systemd stops a service, then a fresh process), and then the projector. A stopping instance
finishes the events in hand (each acknowledged only after its reactions are stored) and hands
back what it fetched and had not started; its sibling carries on meanwhile. No run may fail,
no event may be dead-lettered, no tool call may start twice or be cut short, the projections
must equal a fresh rebuild, and ``nanocrab status`` must show a healthy deployment afterwards.

Sized for a 2-core machine: a trickle of up to NANOCRAB_ROLLING_IN_FLIGHT open runs (default 8,
at most two new ones a second), and before each restart a wave of NANOCRAB_ROLLING_WAVE runs
(default 30), the restart beginning once the first of them has ended (the rest are then in every
stage of the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
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
    ended_of,
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

IN_FLIGHT = int(os.environ.get("NANOCRAB_ROLLING_IN_FLIGHT", "8"))
WAVE = int(os.environ.get("NANOCRAB_ROLLING_WAVE", "30"))


class Load:
    """A steady trickle of runs (up to ``in_flight`` open, at most ``per_tick`` new ones every
    half second: a load, not a saturated machine, as the replacements start on the same two
    cores), plus a wave of runs before each restart (:meth:`wave`)."""

    def __init__(self, topo: Topology, in_flight: int, per_tick: int = 1) -> None:
        self.topo = topo
        self.in_flight = in_flight
        self.per_tick = per_tick
        self.label = f"rolling {uuid.uuid4().hex[:6]}"
        self.runs: list[str] = []
        self.open_at_restart: list[int] = []
        """Runs not ended when each restart began (a measure of the load, not asserted)."""
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._keep_going())

    async def open_runs(self) -> int:
        return len(self.runs) - len(await ended_of(self.topo, self.runs))

    async def wave(self, size: int) -> None:
        """Submit ``size`` runs at once and wait until the first of them ends: the rest are then
        spread over the stages of the loop, so each handler has some of them to do."""
        wave = await self.topo.submit(size, label=f"{self.label} {len(self.runs)}")
        self.runs += wave
        await progress(self.topo, wave, 1, timeout=120)

    async def _keep_going(self) -> None:
        while not self._stop.is_set():
            missing = min(self.per_tick, self.in_flight - await self.open_runs())
            if missing > 0:
                more = await self.topo.submit(missing, label=f"{self.label} {len(self.runs)}")
                self.runs += more
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.5)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


async def restart(topo: Topology, old: subprocess.Popen[bytes], load: Load) -> None:
    """Stop ``old`` as a service manager does (SIGTERM, wait), then start its replacement."""
    name = next(n for n, ps in topo.procs.items() if old in ps)
    await load.wave(WAVE)
    load.open_at_restart.append(await load.open_runs())
    began = asyncio.get_running_loop().time()
    old.terminate()
    code = await asyncio.to_thread(old.wait, 60)
    assert code == 0, f"{name} (pid {old.pid}) exited with {code}:\n{topo.output(old)[-3000:]}"
    stopped = asyncio.get_running_loop().time()
    await topo.wait_ready([topo.spawn(name)], timeout=120)
    ready = asyncio.get_running_loop().time()
    print(f"restarted {name}: stopped in {stopped - began:.1f}s, replacement ready in "
          f"{ready - stopped:.1f}s; {load.open_at_restart[-1]} runs open")  # fmt: skip


async def test_a_rolling_restart_of_every_handler_under_load_fails_no_run(
    tmp_path: Path,
) -> None:
    async with running_topology(tmp_path, ack_wait_s=4.0) as topo:
        await _scenario(topo)


async def _scenario(topo: Topology) -> None:
    for name in LOOP_HANDLERS:
        topo.spawn(name)
        topo.spawn(name)
    topo.spawn("projector")
    await topo.wait_ready([p for ps in topo.procs.values() for p in ps], timeout=180)

    load = Load(topo, IN_FLIGHT)
    load.start()
    try:
        await progress(topo, load.runs, 1, timeout=120)  # the runs are moving
        for name in (*LOOP_HANDLERS, "projector"):
            for old in list(topo.procs[name]):
                await restart(topo, old, load)
    finally:
        await load.stop()
    runs = load.runs
    print(f"{len(runs)} runs; open at each restart: {load.open_at_restart}")

    # every run completes; nothing was given up on
    await progress(topo, runs, len(runs), timeout=180)
    ended = await topo.ended()
    assert {r: ended[r] for r in runs} == {r: "run.completed" for r in runs}
    assert await dead_letters(topo) == []

    # each run's one tool call started once and completed once, and never cut short: a stopping
    # executor finishes the call in hand
    calls = await tool_calls(topo, runs)
    assert_each_call_ran_once(calls, runs)
    cut = {c: es for c, es in calls.items() if any(e.count("/") > 1 for e in es)}
    assert not cut, cut

    # the deployment is healthy: every replica current, no projection behind, no problem
    deadline = asyncio.get_running_loop().time() + 120
    while True:
        status = status_json(topo)
        log = await topo.cli_log()
        health = {s["name"]: s["cluster"] for s in status["streams"]}[log.cfg.log_stream]
        current = all(r["current"] and not r["offline"] for r in health["replicas"])
        behind = [p for p in status["projections"] if p["behind"]]
        if current and health["leader"] and not behind and not status["problems"]:
            break
        assert asyncio.get_running_loop().time() < deadline, (health, behind, status["problems"])
        await asyncio.sleep(1.0)

    await assert_projections_equal_a_rebuild(topo, at_least_rows=len(runs))
