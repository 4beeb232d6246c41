"""Shared set-up for the agent-loop benchmarks: the real handlers on a private nats-server.

Wires the agent loop the way ``nanocrab/cli/wiring.py`` does (orchestrator, policy, executor,
LLM handler, all projections on SQLite) with the scripted offline model answering a one-tool
script: ``read notes.txt`` and then a short answer. Runs are observed the way an external
consumer would: a plain NATS subscription on the runs' terminal subjects.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import msgspec
import psutil
from _common import bench_log, pct
from nats.aio.client import Client as NATS
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog, Reactor, RuntimeOptions, Stored, read_run, sanitize_token
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.cli.host import Host
from nanocrab.events import TaskSubmitted, new_event_id
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator, SpawnTool
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.handlers.sessions import SessionIndex
from nanocrab.llm import ScriptedProvider
from nanocrab.llm.base import DeltaSink, ModelRequest, ModelResponse, Provider
from nanocrab.policy import Policy
from nanocrab.projections import (
    SessionsProjection,
    all_projections,
    default_url,
    make_engine,
)
from nanocrab.projections.sessions import session_snapshot
from nanocrab.security import KeyRing, signed_by
from nanocrab.skills import SkillLibrary, SkillTool, bundled_skills_dir
from nanocrab.tools import LocalOperations, ToolRegistry, default_tools

NOTES = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(1, 11))
"""The small file every benchmark run reads (10 lines, ~550 bytes)."""

ONE_TOOL_SCRIPT = """
scripts:
  - name: one-tool
    turns:
      - tool_calls: [{name: read, input: {path: notes.txt}}]
      - text: "notes.txt has ten lines about a fox."
"""

ONE_TOOL_FLOW = [
    "task.submitted", "run.started", "llm.requested", "llm.responded", "tool.requested",
    "grant.issued", "tool.started", "tool.completed", "llm.requested", "llm.responded",
    "reply.sent", "run.completed",
]  # fmt: skip


BESIDE_THE_FLOW = ("grant.revoked", "guardrail.checked", "alert.raised", "memory.recalled")
"""Events compared apart from the one-tool flow: the policy's revocations (after the end), the
guardrails' verdicts (in production, where the bundled chain guards every checkpoint) and the
memories recalled for the first prompt (their cost shows in llm.requested → llm.responded)."""


def after_the_end_removed(stored: list[Stored]) -> list[Stored]:
    """The run's own flow: without :data:`BESIDE_THE_FLOW`."""
    return [s for s in stored if s.event is None or s.event.type not in BESIDE_THE_FLOW]


@dataclass
class RequestRecord:
    run_id: str
    turn: int
    messages: int
    request_bytes: int


class RecordingProvider:
    """The scripted model, recording each request's size (messages, encoded bytes)."""

    name = "scripted"

    def __init__(self, inner: ScriptedProvider) -> None:
        self.inner = inner
        self.requests: list[RequestRecord] = []

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        size = len(msgspec.json.encode(request))
        self.requests.append(
            RequestRecord(request.run_id, request.turn, len(request.messages), size)
        )
        return await self.inner.complete(request, on_delta=on_delta)


def build_reactors(
    log: EventLog, engine: AsyncEngine, provider: Provider, workspace: Path, *, history: bool = True
) -> list[Reactor]:
    """The agent loop as ``nanocrab.cli.wiring.build_reactors`` builds it (bundled skills)."""
    skills = SkillLibrary.discover([bundled_skills_dir()])
    registry = ToolRegistry([*default_tools(), SkillTool(skills), SpawnTool()])

    session = SessionIndex(log, snapshot=partial(session_snapshot, engine))

    keys = KeyRing(workspace.parent / "keys")
    policy_keys = frozenset({keys.public_key("policy")})

    return [
        Orchestrator(log, trust=signed_by(policy_keys)),
        PolicyHandler(log, policy=BENCH_POLICY, keys=keys, known_tools=frozenset(registry.names()),
                      default_workspace=workspace),
        Executor(log, registry=registry, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
                 default_workspace=workspace, trusted_policy=policy_keys,
                 trusted_approvers=trusted_approvers(BENCH_POLICY, keys)),
        LlmHandler(log, provider=provider, registry=registry, default_workspace=workspace,
                   skills=skills, history=session if history else None),
    ]  # fmt: skip


# Everything the benchmark's scripted agent does is Safe: the figures measure the loop with
# signed, verified grants, not a person answering approvals.
BENCH_POLICY = Policy.from_mapping(
    {
        "version": 1,
        "rules": [
            {"id": "workspace", "tools": ["read", "write", "edit", "ls", "glob", "grep"],
             "paths": ["${workspace}"], "tier": "safe"},
            {"id": "shell", "tools": ["exec"], "tier": "safe"},
            {"id": "agent", "tools": ["skill", "spawn"], "tier": "safe"},
        ],
    },
    source="bench/_agent.py",
)  # fmt: skip


class TimedReactor:
    """Delegates to a reactor, recording wall time spent inside ``handle()`` per event type."""

    def __init__(self, inner: Reactor, times: dict[tuple[str, str], list[float]]) -> None:
        self._inner = inner
        self._times = times

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def handle(self, event, delivery):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return await self._inner.handle(event, delivery)
        finally:
            self._times[(self._inner.name, event.type)].append(time.perf_counter() - t)


class RunWatcher:
    """Plain NATS subscription on ``<root>.*.run.*.run.{completed,failed,cancelled}``."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.arrived: dict[str, float] = {}
        self.outcome: dict[str, str] = {}
        self.counts: dict[str, int] = defaultdict(int)
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._subs: list[object] = []

    async def start(self) -> None:
        root = self.log.cfg.root
        for name in ("completed", "failed", "cancelled"):
            self._subs.append(
                await self.log.nc.subscribe(f"{root}.*.run.*.run.{name}", cb=self._on_msg)
            )

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()  # type: ignore[attr-defined]

    async def _on_msg(self, msg) -> None:  # type: ignore[no-untyped-def]
        now = time.perf_counter()
        tokens = msg.subject.split(".")
        run_id, kind = tokens[3], tokens[5]
        self.counts[kind] += 1
        if run_id not in self.arrived:
            self.arrived[run_id] = now
            self.outcome[run_id] = kind
        waiter = self._waiters.get(run_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def expect(self, run_id: str) -> asyncio.Future[None]:
        key = sanitize_token(run_id)
        fut = self._waiters.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            if key in self.arrived:
                fut.set_result(None)
            self._waiters[key] = fut
        return fut

    def result(self, run_id: str) -> tuple[float, str]:
        key = sanitize_token(run_id)
        return self.arrived[key], self.outcome[key]


@dataclass
class AgentBench:
    log: EventLog
    engine: AsyncEngine
    workspace: Path
    tmp: Path
    provider: RecordingProvider
    host: Host
    watcher: RunWatcher
    handle_times: dict[tuple[str, str], list[float]]

    def handle_report(self) -> list[str]:
        """Median wall time inside each reactor's ``handle()`` per event type (since the last
        ``handle_times.clear()``); the rest of a stage is the bus, queueing and other work."""
        lines = [f"  {'handler · event':<36} {'events':>7} {'median':>9} {'p90':>9}"]
        for (name, etype), values in sorted(self.handle_times.items()):
            lines.append(
                f"  {name + ' · ' + etype:<36} {len(values):>7} "
                f"{statistics.median(values) * 1000:7.3f}ms {pct(values, 90) * 1000:7.3f}ms"
            )
        return lines

    def task(
        self, text: str = "what is in notes.txt?", *, session_id: str | None = None
    ) -> TaskSubmitted:
        rid = new_event_id()
        return TaskSubmitted(
            text=text, run_id=rid, task_id=rid, workspace=str(self.workspace),
            session_id=session_id or new_event_id(),
        )  # fmt: skip

    async def run_one(self, task: TaskSubmitted, wait_s: float = 30.0) -> tuple[float, str]:
        """Append ``task``; wait for its terminal event. Returns (seconds, outcome)."""
        assert task.run_id is not None
        waiter = self.watcher.expect(task.run_id)
        t = time.perf_counter()
        await self.log.append(task)
        await asyncio.wait_for(waiter, wait_s)
        arrived, outcome = self.watcher.result(task.run_id)
        return arrived - t, outcome

    async def stream_state(self) -> tuple[int, int]:
        """(messages, bytes) of the log stream."""
        info = await self.log.js.stream_info(self.log.cfg.log_stream)
        return int(info.state.messages), int(info.state.bytes)

    def db_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.tmp.rglob("projections.db*"))


@contextlib.asynccontextmanager
async def _serving(host: Host) -> AsyncIterator[RunWatcher]:
    """Start the host with a watcher on the runs' terminal subjects; on exit stop both, bring
    the projections up to date and close the engine."""
    watcher = RunWatcher(host.log)
    await watcher.start()
    await host.start()
    try:
        yield watcher
    finally:
        await watcher.stop()
        await host.stop(drain_s=10)
        await host.engine.dispose()


@contextlib.asynccontextmanager
async def agent_bench(
    name: str,
    *,
    options: RuntimeOptions | None = None,
    projections: str = "all",
    config: str = "production",
) -> AsyncIterator[AgentBench]:
    """``config``: ``production`` runs what ``nanocrab up`` runs — the embedded server with
    broker permissions, every handler on its own nkey identity and connection, the bundled
    default policy, the default console trace exporter (``traces.jsonl``), every projection in
    the projection worker's process; ``bare`` is the diagnosis set-up: one unauthenticated
    connection for everything, no tracing, the benchmark's all-Safe policy, and ``projections``:
    ``all``, ``sessions`` (only the one the LLM handler reads) or ``none`` (no SQL at all)."""
    if config == "production":
        async with _production_bench(name, options) as bench:
            yield bench
        return
    async with bench_log(name) as (log, tmp):
        workspace = tmp / "ws"
        workspace.mkdir()
        (workspace / "notes.txt").write_text(NOTES)
        engine = make_engine(default_url(tmp))
        provider = RecordingProvider(ScriptedProvider.from_text(ONE_TOOL_SCRIPT))
        chosen = {
            "all": all_projections(),
            "sessions": [SessionsProjection()],
            "none": [],
        }[projections]
        times: dict[tuple[str, str], list[float]] = defaultdict(list)
        reactors = build_reactors(log, engine, provider, workspace, history=projections != "none")  # type: ignore[arg-type]
        host = Host(
            log,
            engine,
            [TimedReactor(r, times) for r in reactors],  # type: ignore[misc]
            projections=chosen,
            options=options or RuntimeOptions(),
        )
        async with _serving(host) as watcher:
            yield AgentBench(log, engine, workspace, tmp, provider, host, watcher, times)


@contextlib.asynccontextmanager
async def _production_bench(name: str, options: RuntimeOptions | None) -> AsyncIterator[AgentBench]:
    import os
    import tempfile

    from nanocrab.bus.tracing import configure_tracing
    from nanocrab.cli.host import bus_connector
    from nanocrab.cli.settings import Settings
    from nanocrab.cli.wiring import build_reactors as production_reactors

    with tempfile.TemporaryDirectory(prefix=f"nanocrab-bench-{name}-") as tmp_name:
        tmp = Path(tmp_name)
        os.environ["NANOCRAB_HOME"] = str(tmp / "home")
        os.environ.pop("NANOCRAB_NATS_URL", None)
        os.environ.pop("ANTHROPIC_API_KEY", None)
        settings = Settings.from_env()
        configure_tracing(
            f"bench-{name}", exporter=settings.traces, console_path=settings.home / "traces.jsonl"
        )
        workspace = tmp / "ws"
        workspace.mkdir()
        (workspace / "notes.txt").write_text(NOTES)
        provider = RecordingProvider(ScriptedProvider.from_text(ONE_TOOL_SCRIPT))
        times: dict[tuple[str, str], list[float]] = defaultdict(list)
        async with bus_connector(settings.bus(), name=f"bench-{name}", sync=settings.sync) as bus:
            log = bus.log  # the cli identity: it may append task.submitted, as `nanocrab publish`
            logs = await bus.open_runtime()
            engine = make_engine(settings.db_url)
            reactors = production_reactors(
                log, engine, settings, default_workspace=workspace, provider=provider,
                log_for=logs,
            )  # fmt: skip
            host = Host(
                log,
                engine,
                [TimedReactor(r, times) for r in reactors],  # type: ignore[misc]
                options=options or RuntimeOptions(),
                log_for=logs,
                projectors_in="process",
            )
            async with _serving(host) as watcher:
                yield AgentBench(log, engine, workspace, tmp, provider, host, watcher, times)


def calibration() -> str:
    """A fixed pure-Python workload, timed: this VM's speed drifts by tens of percent between
    minutes, so figures from different runs compare only alongside this number."""
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        d: dict[int, int] = {}
        for i in range(200_000):
            d[i & 1023] = d.get(i & 1023, 0) + i
        best = min(best, time.perf_counter() - t)
    return f"calibration loop {best * 1000:.1f} ms (lower is a faster machine right now)"


# -- CPU accounting -----------------------------------------------------------------------


class CpuMeter:
    """CPU seconds spent by this process's event-loop thread, its other threads (aiosqlite's
    worker threads, one per pooled SQLite connection) and the nats-server child, between
    :meth:`start` and :meth:`stop`."""

    def __init__(self, nc: NATS | None = None) -> None:
        self.nc = nc
        self.me = psutil.Process()
        self.main_tid = threading.get_native_id()
        children = self.me.children()
        servers = [c for c in children if "nats-server" in c.name()]
        self.server = servers[0] if servers else None
        # the projection worker's process (production configuration) and any other helper
        self.helpers = [c for c in children if c not in servers]
        self._start = self._sample()
        self.used: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        main = sum(t.user_time + t.system_time for t in self.me.threads() if t.id == self.main_tid)
        total = self.me.cpu_times()  # includes threads that have exited since
        out = {
            "wall": time.perf_counter(),
            "main": main,
            "threads": total.user + total.system - main,
        }
        if self.nc is not None:
            out["msgs_in"] = float(self.nc.stats["in_msgs"])
            out["msgs_out"] = float(self.nc.stats["out_msgs"])
        if self.server is not None:
            st = self.server.cpu_times()
            out["server"] = st.user + st.system
        if self.helpers:
            out["helpers"] = 0.0
            for child in self.helpers:
                with contextlib.suppress(psutil.Error):
                    ct = child.cpu_times()
                    out["helpers"] += ct.user + ct.system
        return out

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> dict[str, float]:
        end = self._sample()
        self.used = {k: end[k] - self._start.get(k, 0.0) for k in end}
        return self.used

    def report(self, per: int, unit: str = "run") -> str:
        u = self.used
        wall = u["wall"]
        parts = [
            f"{label} {u[k] / per * 1000:.2f} ms/{unit} ({u[k] / wall * 100:.0f}% of a core)"
            for k, label in (
                ("main", "python event loop"),
                ("threads", "python other threads (SQLite)"),
                ("server", "nats-server"),
                ("helpers", "child processes (projection worker)"),
            )
            if k in u
        ]
        line = "CPU: " + " · ".join(parts)
        if "msgs_in" in u:
            line += (
                f"\nNATS messages on the client connection: {u['msgs_in'] / per:.0f} in, "
                f"{u['msgs_out'] / per:.0f} out per {unit}"
            )
        return line


# -- per-stage breakdown --------------------------------------------------------------------


def stage_times(stored: Sequence[Stored]) -> list[tuple[str, float]]:
    """(``prev → next`` label, seconds) between consecutive events of one run, by event ``time``.

    Repeated types are numbered (``llm.requested#2``) so the two model turns stay apart.
    """
    events = [s.event for s in stored if s.event is not None]
    seen: dict[str, int] = defaultdict(int)
    names = []
    for e in events:
        seen[e.type] += 1
        names.append(e.type if seen[e.type] == 1 else f"{e.type}#{seen[e.type]}")
    return [
        (f"{names[i - 1]} → {names[i]}", (events[i].time - events[i - 1].time).total_seconds())
        for i in range(1, len(events))
    ]


def stored_times(stored: Sequence[Stored]) -> list[float]:
    """Seconds between consecutive JetStream storage timestamps of one run's events."""
    return [(stored[i].stored_ns - stored[i - 1].stored_ns) / 1e9 for i in range(1, len(stored))]


async def breakdown(log: EventLog, run_ids: Sequence[str]) -> tuple[list[str], int]:
    """Median per stage over ``run_ids`` (read back with ``read_run``), as printable lines.

    Returns the lines and how many runs had the usual one-tool event sequence.
    """
    per_stage: dict[str, list[float]] = defaultdict(list)
    per_stage_stored: dict[str, list[float]] = defaultdict(list)
    order: list[str] = []
    typical = 0
    totals: list[float] = []
    recalled: list[float] = []  # llm.requested → memory.recalled (the recall the call awaits)
    for rid in run_ids:
        everything = await read_run(log, rid)
        stored = after_the_end_removed(everything)
        types = [s.event.type for s in stored if s.event is not None]
        if types != ONE_TOOL_FLOW:
            continue
        typical += 1
        first = {}
        for s in everything:
            if s.event is not None and s.event.type not in first:
                first[s.event.type] = s.event.time
        if "memory.recalled" in first:
            recalled.append((first["memory.recalled"] - first["llm.requested"]).total_seconds())
        stages = stage_times(stored)
        for (label, secs), st in zip(stages, stored_times(stored), strict=True):
            if label not in per_stage:
                order.append(label)
            per_stage[label].append(secs)
            per_stage_stored[label].append(st)
        totals.append(sum(s for _, s in stages))
    lines = [f"  {'stage (event time → event time)':<44} {'median':>9} {'stored Δ':>9}  share"]
    total = statistics.median(totals) if totals else 0.0
    for label in order:
        med = statistics.median(per_stage[label])
        med_st = statistics.median(per_stage_stored[label])
        share = med / total * 100 if total else 0.0
        bar = "#" * round(share / 2)
        lines.append(
            f"  {label:<44} {med * 1000:7.3f}ms {med_st * 1000:7.3f}ms {share:5.1f}% {bar}"
        )
    lines.append(f"  {'task.submitted → run.completed (sum)':<44} {total * 1000:7.3f}ms")
    if recalled:
        lines.append(
            f"  of llm.requested → llm.responded, the wait for the run-start recall "
            f"(→ memory.recalled): {statistics.median(recalled) * 1000:.3f}ms median "
            f"({len(recalled)} of {typical} runs recalled something)"
        )
    return lines, typical
