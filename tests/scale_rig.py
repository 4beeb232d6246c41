"""The scaled-out topology as processes on loopback: a three-node NATS cluster from the wheel
(streams R3, the generated authorization), a fresh PostgreSQL database, and each handler as
``nanocrab handler NAME`` processes, each host with only its own seed.

Used by tests/test_scale_failover.py and bench/scaling.py; the same topology compose.yaml
describes, without Docker.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from nanocrab.bus import BusConfig, Connector, EventLog, Window, read
from nanocrab.bus.cluster import LocalCluster
from nanocrab.bus.permissions import CLI
from nanocrab.cli.agent import new_task
from nanocrab.cli.host import seed_source, server_authorization
from nanocrab.cli.provision import export_host_keys
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
