"""Python agents: run latency of the example ``todo-counter`` agent under a real ``nanocrab up``.

Starts ``nanocrab up`` (embedded nats-server, every handler under its own broker identity,
projections, guardrails off) in a temporary directory whose workspace holds three TODOs, then
submits ``--runs`` tasks to ``todo-counter`` one after the other (3 tool calls: ls, grep, read;
4 turns answered by the agent's code, each call decided by the policy and run by the executor)
and reports the time from ``task.submitted`` to ``run.completed`` (event timestamps).

Usage: .venv/bin/python bench/pyagent.py [--runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from nanocrab.bus import BusConfig, read, read_run
from nanocrab.cli.host import bus_session
from nanocrab.events import RunCompleted, RunFailed, TaskSubmitted, new_event_id

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "agents"


async def runs(home: Path, n: int) -> list[float]:
    async with bus_session(BusConfig(data_dir=home), name="bench") as (log, _server):
        out: list[float] = []
        for _ in range(n):
            rid = new_event_id()
            await log.append(TaskSubmitted(text="count TODOs", agent="todo-counter", run_id=rid,
                                           task_id=rid, session_id=new_event_id()))  # fmt: skip
            async for s in read(log, log.subjects.run(rid), follow=True):
                if isinstance(s.event, RunFailed):
                    raise SystemExit(f"run failed: {s.event.reason}")
                if isinstance(s.event, RunCompleted):
                    break
            events = [s.event for s in await read_run(log, rid) if s.event is not None]
            out.append((events[-1].time - events[0].time).total_seconds() * 1000)
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nanocrab-pyagent-") as tmp:
        home, ws = Path(tmp) / "home", Path(tmp) / "ws"
        home.mkdir()
        (ws / "src").mkdir(parents=True)
        (ws / "src" / "a.py").write_text("# TODO one\nx = 1\n# TODO two\n")
        (ws / "b.py").write_text("y = 2  # TODO three\n")
        (home / "agents.yaml").write_text((EXAMPLES / "agents.yaml").read_text())
        for name in ("todo_counter.py", "notes_reporter.py"):
            (home / name).write_text((EXAMPLES / name).read_text())
        env = {k: v for k, v in os.environ.items() if not k.startswith("NANOCRAB_")}
        env.update(NANOCRAB_HOME=str(home), NANOCRAB_GUARDRAILS="none")
        up = subprocess.Popen(
            [sys.executable, "-m", "nanocrab", "up"], cwd=ws, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert up.stdout is not None
            print(up.stdout.readline().strip())
            asyncio.run(runs(home, 5))  # warm-up: modules loaded, consumers settled
            lat = sorted(asyncio.run(runs(home, args.runs)))
        finally:
            up.send_signal(signal.SIGINT)
            up.communicate(timeout=60)
    p90 = lat[max(0, int(0.9 * len(lat)) - 1)]
    print(
        f"todo-counter, {len(lat)} runs one after the other (3 tool calls, 4 turns each): "
        f"p50 {statistics.median(lat):.0f} ms, p90 {p90:.0f} ms, max {lat[-1]:.0f} ms"
    )


if __name__ == "__main__":
    main()
