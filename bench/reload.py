"""Hot reload: time from a file save to ``reload.activated``, and runs in flight while the
configuration is reloaded every second under load.

The real loop (orchestrator, policy, executor, LLM handler, reloader; no projections) runs in
this process on a private embedded nats-server, reading its configuration through a
``ConfigView``; the reloader watches a temporary configuration directory with its production
settings (``watchfiles``, 1 s debounce bound, 50 ms quiet step). The model is in-process with
zero latency: every run asks for the ``skill`` tool once, then answers.

1. Save → activated: ``--saves`` edits of a skill, one at a time; for each, the time from the
   write to (a) the ``reload.activated`` arriving at a plain NATS subscriber, (b) this
   process's view serving the new version.
2. Under load: ``--workers`` clients each submit a run and wait for it, back to back, for
   ``--seconds`` without reloading (baseline), then as long again while the skill is edited
   every second. Reported: runs, failures, run latency p50/p99/max, runs whose skill body was
   not their pinned version's (must be 0), and how many versions the runs were pinned to.

3. The cost of pinning: ``ConfigView.version_at`` for a position the view has not confirmed
   (one batched direct get of the switch subject), as every run start pays it.

Usage: .venv/bin/python bench/reload.py [--saves 10] [--workers 8] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _common import bench_log, machine, pct

from nanocrab.bus import EventLog, Reactor, RuntimeOptions, read_run
from nanocrab.bus.artifacts import JetStreamArtifacts
from nanocrab.cli.host import Host
from nanocrab.events import (
    Event,
    MemoryConsolidated,
    ReloadActivated,
    RunCompleted,
    RunFailed,
    RunStarted,
    TaskSubmitted,
    TextBlock,
    ToolCompleted,
    ToolUseBlock,
    Usage,
    new_event_id,
)
from nanocrab.handlers.executor import Executor
from nanocrab.handlers.llm import LlmHandler
from nanocrab.handlers.orchestrator import Orchestrator, SpawnTool
from nanocrab.handlers.policy import PolicyHandler, trusted_approvers
from nanocrab.handlers.reloader import Reloader
from nanocrab.llm.base import DeltaSink, ModelRequest, ModelResponse
from nanocrab.policy import Policy
from nanocrab.projections import make_engine
from nanocrab.reload import BaseConfig, ConfigView, LoadedConfig
from nanocrab.reload.skills import VersionedSkills
from nanocrab.security import KeyRing, signed_by
from nanocrab.skills import SkillLibrary, SkillTool
from nanocrab.tools import LocalOperations, ToolRegistry, default_tools

POLICY_YAML = """\
version: 1
rules:
  - id: agent
    tools: [skill]
    tier: safe
"""


class Model:
    name = "bench"

    async def complete(
        self, request: ModelRequest, *, on_delta: DeltaSink | None = None
    ) -> ModelResponse:
        if request.turn == 0:
            block = ToolUseBlock(id="t0", name="skill", input={"name": "greet"})
            return ModelResponse(content=[block], stop_reason="tool_use", usage=Usage())
        return ModelResponse(content=[TextBlock(text="done")], stop_reason="end_turn")


def write_skill(config: Path, n: int) -> None:
    path = config / "skills" / "greet" / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nname: greet\ndescription: Greets, edition {n}.\n---\nBODY-{n}\n")


def wire(log: EventLog, tmp: Path, config: Path) -> tuple[list[Reactor], ConfigView, Reloader]:
    policy = Policy.from_mapping({"version": 1, "rules": [
        {"id": "agent", "tools": ["skill"], "tier": "safe"}]})  # fmt: skip
    startup = LoadedConfig(version="", policy=policy, guardrails=None, guardrails_text=None,
                           agents=None, skills=SkillLibrary())  # fmt: skip
    view = ConfigView(startup, base=BaseConfig(guardrails=False), cache_dir=tmp / "cv", log=log)
    skills = VersionedSkills(view)
    reg = ToolRegistry([*default_tools(), SkillTool(skills), SpawnTool()])
    keys = KeyRing(tmp / "keys")
    trusted = frozenset({keys.public_key("policy")})
    ws = tmp / "ws"
    ws.mkdir(exist_ok=True)
    reloader = Reloader(log, view=view, config_dir=config)
    reactors: list[Reactor] = [
        Orchestrator(log, trust=signed_by(trusted), config=view),
        PolicyHandler(log, policy=policy, keys=keys, known_tools=frozenset(reg.names()),
                      default_workspace=ws, config=view),
        Executor(log, registry=reg, ops=LocalOperations(), artifacts=JetStreamArtifacts(log),
                 default_workspace=ws, trusted_policy=trusted,
                 trusted_approvers=trusted_approvers(policy, keys), config=view),
        LlmHandler(log, provider=Model(), registry=reg, default_workspace=ws, skills=skills),
        reloader,
    ]  # fmt: skip
    return reactors, view, reloader


async def save_to_activated(
    log: EventLog, view: ConfigView, config: Path, saves: int, first: int
) -> tuple[list[float], list[float]]:
    arrived: asyncio.Queue[tuple[str, float]] = asyncio.Queue()

    async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
        event = log.decode(msg.data, subject=msg.subject)
        if isinstance(event, ReloadActivated):
            arrived.put_nowait((event.version, time.perf_counter()))

    sub = await log.nc.subscribe(f"{log.cfg.root}.*.system.config.reload.activated", cb=on_msg)
    to_event: list[float] = []
    to_view: list[float] = []
    try:
        for n in range(first, first + saves):
            before = view.active
            t0 = time.perf_counter()
            write_skill(config, n)
            _version, at = await asyncio.wait_for(arrived.get(), 10)
            to_event.append(at - t0)
            while view.active == before:
                await asyncio.wait_for(view.changed.wait(), 10)
            to_view.append(time.perf_counter() - t0)
            await asyncio.sleep(0.3)
    finally:
        await sub.unsubscribe()
    return to_event, to_view


async def load(
    log: EventLog, view: ConfigView, config: Path, workers: int, seconds: float, edit: bool,
    first: int,
) -> dict[str, object]:  # fmt: skip
    latencies: list[float] = []
    runs: list[str] = []
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < stop:
            rid = new_event_id()
            runs.append(rid)
            t0 = time.perf_counter()
            done = asyncio.get_running_loop().create_future()
            waiting[rid] = done
            await log.append(TaskSubmitted(text="greet", run_id=rid, task_id=rid,
                                           session_id=new_event_id()))  # fmt: skip
            await asyncio.wait_for(done, 60)
            latencies.append(time.perf_counter() - t0)

    waiting: dict[str, asyncio.Future[None]] = {}

    async def on_end(msg) -> None:  # type: ignore[no-untyped-def]
        rid = msg.subject.split(".")[3]
        fut = waiting.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    subs = [await log.nc.subscribe(f"{log.cfg.root}.*.run.*.run.{n}", cb=on_end)
            for n in ("completed", "failed")]  # fmt: skip

    async def editor() -> int:
        n = first
        while time.perf_counter() < stop:
            await asyncio.sleep(1.0)
            write_skill(config, n)
            n += 1
        return n - first

    try:
        edits_task = asyncio.create_task(editor()) if edit else None
        await asyncio.gather(*(worker() for _ in range(workers)))
        edits = await edits_task if edits_task else 0
    finally:
        for s in subs:
            await s.unsubscribe()
    failed = mismatched = 0
    pins: Counter[str] = Counter()
    for rid in runs:
        events: list[Event] = [s.event for s in await read_run(log, rid) if s.event]
        if any(isinstance(e, RunFailed) for e in events) or not any(
            isinstance(e, RunCompleted) for e in events
        ):
            failed += 1
            continue
        pin = next(e.config for e in events if isinstance(e, RunStarted))
        pins[pin] += 1
        text = "".join(b.text for e in events if isinstance(e, ToolCompleted)
                       for b in e.content if isinstance(b, TextBlock))  # fmt: skip
        expected = (await view.ensure(pin)).skills.body("greet")
        if expected not in text:
            mismatched += 1
    return {"runs": len(runs), "failed": failed, "mismatched": mismatched, "edits": edits,
            "versions": len(pins), "latencies": latencies}  # fmt: skip


async def pin_cost(log: EventLog, view: ConfigView, n: int) -> list[float]:
    """Microseconds per ``version_at`` for a new position (what each run start costs)."""
    out = []
    for _ in range(n):
        seq = (await log.append(MemoryConsolidated(episode_id="e", summary="s"))).seq
        t0 = time.perf_counter()
        await view.version_at(seq)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def fmt(result: dict[str, object]) -> str:
    lat = [v * 1000 for v in result["latencies"]]  # type: ignore[attr-defined]
    return (
        f"{result['runs']} runs, {result['failed']} failed/unfinished, "
        f"{result['mismatched']} served another version's skill, pinned to "
        f"{result['versions']} versions, {result['edits']} edits · run latency p50 "
        f"{pct(lat, 50):.1f} ms · p99 {pct(lat, 99):.1f} ms · max {max(lat):.1f} ms"
    )


async def main(saves: int, workers: int, seconds: float) -> None:
    print(f"bench/reload.py · {machine()}")
    async with bench_log("reload") as (log, _):
        with tempfile.TemporaryDirectory(prefix="nanocrab-reload-") as tmp_s:
            tmp = Path(tmp_s)
            config = tmp / "config"
            config.mkdir()
            (config / "policy.yaml").write_text(POLICY_YAML)
            write_skill(config, 0)
            reactors, view, reloader = wire(log, tmp, config)
            engine = make_engine(f"sqlite+aiosqlite:///{tmp / 'p.db'}")
            host = Host(log, engine, reactors, projections=[], options=RuntimeOptions())
            await host.start()
            try:
                await asyncio.wait_for(reloader.watching.wait(), 10)
                await reloader.propose_now(force=True)
                while not view.active:
                    await asyncio.wait_for(view.changed.wait(), 10)
                to_event, to_view = await save_to_activated(log, view, config, saves, 1)
                ms_e = [v * 1000 for v in to_event]
                ms_v = [v * 1000 for v in to_view]
                print(
                    f"save → reload.activated at a subscriber ({saves} saves): p50 "
                    f"{pct(ms_e, 50):.0f} ms · max {max(ms_e):.0f} ms (target ≤ 2000 ms)"
                )
                print(f"save → this process's view serving it: p50 {pct(ms_v, 50):.0f} ms · "
                      f"max {max(ms_v):.0f} ms")  # fmt: skip
                per_start = await pin_cost(log, view, 300)
                print(f"pinning a run's version (ConfigView.version_at, one direct get when the "
                      f"view has not seen that far): p50 {pct(per_start, 50):.0f} µs · p99 "
                      f"{pct(per_start, 99):.0f} µs; other handlers: a dict lookup")  # fmt: skip
                base = await load(log, view, config, workers, seconds, False, 0)
                print(f"baseline, no reload, {workers} clients x {seconds:g} s: {fmt(base)}")
                hot = await load(log, view, config, workers, seconds, True, 1000)
                print(f"reloading every second, {workers} clients x {seconds:g} s: {fmt(hot)}")
            finally:
                await host.stop(drain_s=1)
                await view.stop()
                await engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--saves", type=int, default=10)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    asyncio.run(main(args.saves, args.workers, args.seconds))
