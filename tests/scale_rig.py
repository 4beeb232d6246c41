"""The scaled-out topology as processes on loopback: a three-node NATS cluster from the wheel
(streams R3, the generated authorization), a fresh PostgreSQL database, and each handler as
``nanocrab handler NAME`` processes, each host with only its own seed.

Used by tests/test_scale_failover.py, tests/test_scale_rolling.py and bench/scaling.py; the same
topology compose.yaml describes, without Docker. The checks both scale tests make on the outcome
(runs ended, tool calls, projections against a rebuild, ``nanocrab status``) are here too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import BusConfig, BusError, Connector, EventLog, Window, read
from nanocrab.bus.cluster import LocalCluster
from nanocrab.bus.permissions import CLI
from nanocrab.cli.agent import new_task
from nanocrab.cli.host import seed_source, server_authorization
from nanocrab.cli.provision import export_host_keys
from nanocrab.events import (
    BusDeadLettered,
    BusMalformed,
    GrantIssued,
    ToolCompleted,
    ToolRequested,
    ToolStarted,
)
from nanocrab.projections import Projector, all_projections, make_engine
from nanocrab.security import KeyRing

PG = "postgres@127.0.0.1:5432"
LOOP_HANDLERS = ("orchestrator", "policy", "executor", "llm")
"""What a run needs with guardrails off and no routing: the agent loop."""

SCRIPT = """\
scripts:
  - name: note
    turns:
      - text: "Writing a note."
        tool_calls:
          - {name: write, input: {path: "note.txt", content: "noted"}}
      - text: "Done: {task}"
"""
"""One tool call per run, so every run passes policy and executor: ``write``, a tool that is
not idempotent, so a call interrupted by a crash must never run again (it completes
``interrupted``)."""

POLICY = """\
version: 1
grant_ttl: 600
approval: {timeout: 300, approvers: [], trust_local_approver: true}
rules:
  - id: write-workspace
    tools: [write]
    paths: ["${workspace}"]
    tier: safe
"""
"""The tests' policy: writes in the workspace need no approval (nobody is there to approve)."""


async def create_database(name: str) -> str:
    """A fresh PostgreSQL database; returns its SQLAlchemy URL."""
    import asyncpg

    admin = await asyncpg.connect(host="127.0.0.1", port=5432, user="postgres")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return f"postgresql+asyncpg://{PG}/{name}"


async def drop_database(name: str) -> None:
    import asyncpg

    admin = await asyncpg.connect(host="127.0.0.1", port=5432, user="postgres")
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@dataclass
class Topology:
    """Start with :meth:`start`, add processes with :meth:`spawn`, stop with :meth:`stop`."""

    root: Path
    nodes: int = 3
    ack_wait_s: float = 30.0
    db_name: str = field(default_factory=lambda: f"nanocrab_scale_{uuid.uuid4().hex[:10]}")
    cluster: LocalCluster | None = None
    db_url: str = ""
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)
    connector: Connector | None = None
    _log_files: dict[int, Path] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        """The operator's data dir: every seed (the cluster's authorization lists them)."""
        return self.root / "home"

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def cfg(self) -> BusConfig:
        return BusConfig(
            url=self.cluster.url if self.cluster else None, data_dir=self.home, auth=True,
            replicas=min(3, self.nodes),
        )  # fmt: skip

    async def start(self) -> None:
        self.workspace.mkdir(parents=True, exist_ok=True)
        (self.workspace / "notes.txt").write_text("hello\n")
        (self.root / "script.yaml").write_text(SCRIPT)
        (self.root / "policy.yaml").write_text(POLICY)
        ring = KeyRing(self.home / "keys")
        self.cluster = LocalCluster(
            self.root / "cluster",
            nodes=self.nodes,
            authorization=server_authorization(ring, self.cfg.model_copy(update={"url": None})),
        )
        await asyncio.to_thread(self.cluster.start)
        cfg = self.cfg
        self.connector = Connector(
            self.cluster.url, cfg, seeds=seed_source(ring, create=False), name="scale-test"
        )
        await self.connector.setup()
        self.db_url = await create_database(self.db_name)

    def env(self, home: Path) -> dict[str, str]:
        assert self.cluster is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("NANOCRAB_")}
        env.pop("ANTHROPIC_API_KEY", None)
        env.update(
            NANOCRAB_HOME=str(home),
            NANOCRAB_NATS_URL=self.cluster.url,
            NANOCRAB_NATS_AUTH="nkeys",
            NANOCRAB_STREAM_REPLICAS=str(self.cfg.replicas),
            NANOCRAB_DB_URL=self.db_url,
            NANOCRAB_TRACES="none",
            NANOCRAB_PROVIDER="scripted",
            NANOCRAB_SCRIPT=str(self.root / "script.yaml"),
            NANOCRAB_POLICY=str(self.root / "policy.yaml"),
            NANOCRAB_GUARDRAILS="none",
            NANOCRAB_RECALL="off",
        )
        return env

    def host_home(self, name: str) -> Path:
        """A handler host's data dir: only ``name``'s seed and the public keys it verifies."""
        home = self.root / "hosts" / name
        if not (home / "keys" / f"{name}.nk").exists():
            export_host_keys(KeyRing(self.home / "keys"), name, home / "keys")
        return home

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        """One more ``nanocrab handler NAME`` process."""
        home = self.host_home(name)
        out = self.root / "logs" / f"{name}-{len(self.procs.get(name, []))}.log"
        out.parent.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "nanocrab", "handler", name]
        if name != "projector":
            args += ["--ack-wait", str(self.ack_wait_s)]
        with out.open("wb") as fh:
            proc = subprocess.Popen(
                args, cwd=self.workspace, env=self.env(home), stdout=fh, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self.procs.setdefault(name, []).append(proc)
        self._log_files[proc.pid] = out
        return proc

    def output(self, proc: subprocess.Popen[bytes]) -> str:
        return self._log_files[proc.pid].read_text(errors="replace")

    async def wait_ready(self, procs: Iterable[subprocess.Popen[bytes]], timeout: float) -> None:
        """Wait until each process says it is serving (its start-up line)."""
        deadline = asyncio.get_running_loop().time() + timeout
        for proc in procs:
            while f"(pid {proc.pid}) on" not in self.output(proc):
                if proc.poll() is not None:
                    raise AssertionError(f"pid {proc.pid} exited:\n{self.output(proc)[-3000:]}")
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"pid {proc.pid} not ready:\n{self.output(proc)[-3000:]}")
                await asyncio.sleep(0.2)

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """``kill -9``: no drain, no ack, no goodbye."""
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    async def cli_log(self) -> EventLog:
        assert self.connector is not None
        return await self.connector.open(CLI)

    async def submit(self, count: int, label: str = "task") -> list[str]:
        log = await self.cli_log()
        runs = []
        for i in range(count):
            event = new_task(f"{label} {i}", "default", None, workspace=self.workspace)
            await log.append(event)
            runs.append(event.run_id)
        return runs

    async def ended(self) -> dict[str, str]:
        """Each run that ended: run id -> its last event type (run.completed / run.failed)."""
        log = await self.cli_log()
        out: dict[str, str] = {}
        for kind in ("run.completed", "run.failed", "run.cancelled"):
            async for s in read(log, log.subjects.of_type(kind), Window()):
                if s.event is not None:
                    out[s.event.run_id] = kind
        return out

    async def stop(self) -> None:
        for procs in self.procs.values():
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        for procs in self.procs.values():
            for proc in procs:
                try:
                    await asyncio.to_thread(proc.wait, 20)
                except subprocess.TimeoutExpired:
                    self.kill(proc)
        if self.connector is not None:
            await self.connector.close()
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)
        if self.db_url:
            await drop_database(self.db_name)


@contextlib.asynccontextmanager
async def running_topology(tmp_path: Path, **kw: Any) -> AsyncIterator[Topology]:
    """A started :class:`Topology`, stopped at the end; the tail of every process's output is
    printed then (what a failing scale test needs to be understood)."""
    topo = Topology(tmp_path, **kw)
    await topo.start()
    try:
        yield topo
    finally:
        await topo.stop()
        print(
            "\n".join(f"{p}: {topo.output(x)[-400:]}" for p, xs in topo.procs.items() for x in xs)
        )


def status_json(topo: Topology) -> dict[str, Any]:
    """``nanocrab status --json`` as the operator runs it (from the data dir holding the keys)."""
    out = subprocess.run(
        [sys.executable, "-m", "nanocrab", "status", "--json"], env=topo.env(topo.home),
        capture_output=True, text=True, timeout=120, cwd=topo.workspace,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


async def ended_of(topo: Topology, runs: Iterable[str]) -> set[str]:
    """Which of ``runs`` ended (an empty set while a stream leader is being elected)."""
    try:
        return set(runs) & set(await topo.ended())
    except (nats.errors.TimeoutError, BusError):
        return set()


async def progress(topo: Topology, runs: list[str], at_least: int, timeout: float) -> int:
    """Wait until ``at_least`` of ``runs`` ended; returns how many have. On time-out, fails with
    the timelines of a few runs that did not end and the handlers' consumers."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        done = len(await ended_of(topo, runs))
        if done >= at_least:
            return done
        if asyncio.get_running_loop().time() > deadline:
            stuck = await timelines(topo, set(runs) - set(await topo.ended()))
            log = await topo.cli_log()
            consumers = [
                (c.name, c.num_pending, c.num_ack_pending, c.num_redelivered)
                for c in await log.js.consumers_info(log.cfg.log_stream)
                if c.config.durable_name
            ]
            raise AssertionError(
                f"only {done}/{len(runs)} runs ended within {timeout}s: {stuck}; consumers "
                f"(name, pending, unacked, redelivered): {consumers}; dead letters: "
                f"{await dead_letters(topo)}"
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


async def dead_letters(topo: Topology) -> list[str]:
    """Every ``bus.dead_lettered`` / ``bus.malformed`` in the log: which handler, which
    sequence, why."""
    log = await topo.cli_log()
    out = []
    for kind in ("bus.dead_lettered", "bus.malformed"):
        async for s in read(log, log.subjects.of_type(kind), Window()):
            if isinstance(s.event, BusDeadLettered | BusMalformed):
                e = s.event
                out.append(f"{e.handler} seq {e.stream_seq} ({e.reason_kind}): {e.reason[:200]}")
    return out


async def tool_calls(topo: Topology, runs: list[str]) -> dict[str, list[str]]:
    """Each tool call of ``runs``: its requests, grants, starts and completions, in log order
    (``seq:type/source[/error kind]``)."""
    log = await topo.cli_log()
    mine = set(runs)
    calls: dict[str, list[str]] = collections.defaultdict(list)
    async for s in read(log, log.subjects.log_all, Window()):
        e = s.event
        if e is None or e.run_id not in mine:
            continue
        if isinstance(e, ToolStarted | ToolCompleted | GrantIssued | ToolRequested):
            kind = getattr(e, "error_kind", "") or ""
            calls[e.call_id].append(f"{s.seq}:{e.type}/{e.source}{'/' + kind if kind else ''}")
    return calls


def assert_each_call_ran_once(calls: dict[str, list[str]], runs: list[str]) -> None:
    """One call per run (the script's ``write``), started at most once and completed once: the
    executor's interrupted-call rule holds across instances."""

    def count(entries: list[str], kind: str) -> int:
        return sum(1 for e in entries if e.split(":", 1)[1].startswith(kind + "/"))

    twice = {c: es for c, es in calls.items()
             if count(es, "tool.started") > 1 or count(es, "tool.completed") != 1}  # fmt: skip
    assert len(calls) == len(runs), f"{len(calls)} calls for {len(runs)} runs"
    assert not twice, twice
    assert any(count(es, "tool.started") for es in calls.values())


async def table_contents(engine: AsyncEngine) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    async with engine.connect() as conn:
        for projection in all_projections():
            for table in projection.tables:
                order = list(table.primary_key.columns) or list(table.columns)
                rows = await conn.execute(select(table).order_by(*order))
                out[table.name] = [tuple(r) for r in rows]
    return out


async def assert_projections_equal_a_rebuild(topo: Topology, at_least_rows: int) -> None:
    """The live projections (PostgreSQL, kept by the projector processes) equal a fresh rebuild
    of every projection from sequence 0 into a new database."""
    log = await topo.cli_log()
    live = make_engine(topo.db_url)
    fresh_name = f"{topo.db_name}_rebuild"
    fresh = make_engine(await create_database(fresh_name))
    try:
        for projection in all_projections():
            await Projector(log, fresh, projection).rebuild()
        projected, rebuilt = await table_contents(live), await table_contents(fresh)
        assert sum(len(v) for v in projected.values()) > at_least_rows
        assert projected == rebuilt
    finally:
        await live.dispose()
        await fresh.dispose()
        await drop_database(fresh_name)
