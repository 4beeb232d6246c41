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
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from _common import bench_log
from nanocrab.bus import EventLog, Reactor, RuntimeOptions, Stored, read_run, sanitize_token
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.cli.host import Host
from nanocrab.events import TaskSubmitted, new_event_id
from nanocrab.handlers.conversation import history_messages
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator, SpawnTool
from nanocrab.handlers.policy import BasicPolicy
from nanocrab.llm import ScriptedProvider
from nanocrab.llm.base import DeltaSink, Message, ModelRequest, ModelResponse, Provider
from nanocrab.projections import default_url, make_engine, session_history
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

ONE_TOOL_FLOW = (
    "task.submitted run.started llm.requested llm.responded tool.requested grant.issued "
    "tool.started tool.completed llm.requested llm.responded reply.sent run.completed"
).split()


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
        self.requests.append(RequestRecord(request.run_id, request.turn, len(request.messages), size))
        return await self.inner.complete(request, on_delta=on_delta)


def build_reactors(
    log: EventLog, engine: AsyncEngine, provider: Provider, workspace: Path
) -> list[Reactor]:
    """The agent loop as ``nanocrab.cli.wiring.build_reactors`` builds it (bundled skills)."""
    skills = SkillLibrary.discover([bundled_skills_dir()])
    registry = ToolRegistry([*default_tools(), SkillTool(skills), SpawnTool()])

    async def history(session_id: str, run_id: str) -> list[Message]:
        return history_messages(await session_history(engine, session_id, run_id))

    return [
        Orchestrator(log),
        BasicPolicy(log, default_workspace=workspace),
        Executor(log, registry=registry, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
                 default_workspace=workspace),
        LlmHandler(log, provider=provider, registry=registry, default_workspace=workspace,
                   skills=skills, history=history),
    ]  # fmt: skip


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
    submitted: list[str] = field(default_factory=list)

    def task(self, text: str = "what is in notes.txt?", *, session_id: str | None = None):
        rid = new_event_id()
        return TaskSubmitted(
            text=text, run_id=rid, task_id=rid, workspace=str(self.workspace),
            session_id=session_id or new_event_id(),
        )  # fmt: skip

    async def run_one(self, task: TaskSubmitted, timeout: float = 30.0) -> tuple[float, str]:
        """Append ``task``; wait for its terminal event. Returns (seconds, outcome)."""
        assert task.run_id is not None
        waiter = self.watcher.expect(task.run_id)
        self.submitted.append(task.run_id)
        t = time.perf_counter()
        await self.log.append(task)
        await asyncio.wait_for(waiter, timeout)
        arrived, outcome = self.watcher.result(task.run_id)
        return arrived - t, outcome

    async def stream_state(self) -> tuple[int, int]:
        """(messages, bytes) of the log stream."""
        info = await self.log.js.stream_info(self.log.cfg.log_stream)
        return int(info.state.messages), int(info.state.bytes)

    def db_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.tmp.glob("projections.db*"))


@contextlib.asynccontextmanager
async def agent_bench(
    name: str, *, options: RuntimeOptions | None = None
) -> AsyncIterator[AgentBench]:
    async with bench_log(name) as (log, tmp):
        workspace = tmp / "ws"
        workspace.mkdir()
        (workspace / "notes.txt").write_text(NOTES)
        engine = make_engine(default_url(tmp))
        provider = RecordingProvider(ScriptedProvider.from_text(ONE_TOOL_SCRIPT))
        host = Host(
            log,
            engine,
            build_reactors(log, engine, provider, workspace),  # type: ignore[arg-type]
            options=options or RuntimeOptions(),
        )
        watcher = RunWatcher(log)
        await watcher.start()
        await host.start()
        try:
            yield AgentBench(log, engine, workspace, tmp, provider, host, watcher)
        finally:
            await watcher.stop()
            await host.stop(drain_s=10)
            await engine.dispose()


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
    for rid in run_ids:
        stored = await read_run(log, rid)
        types = [s.event.type for s in stored if s.event is not None]
        if types != ONE_TOOL_FLOW:
            continue
        typical += 1
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
        lines.append(f"  {label:<44} {med * 1000:7.3f}ms {med_st * 1000:7.3f}ms {share:5.1f}% {bar}")
    lines.append(f"  {'task.submitted → run.completed (sum)':<44} {total * 1000:7.3f}ms")
    return lines, typical
