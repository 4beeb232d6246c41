"""nanocrab vs LangGraph on the same one-tool turn, in one bench run.

The turn: a task "what is in notes.txt?", a model that asks for ``read notes.txt`` (a 10-line,
~550-byte file), the tool reads it, the model answers. Zero model latency on both sides.

* nanocrab: the real agent loop on a private embedded nats-server (orchestrator, policy, executor,
  LLM handler, all SQLite projections, default ``RuntimeOptions``), scripted model; latency is
  ``task.submitted`` appended → ``run.completed`` seen by a NATS subscriber.
* LangGraph: ``langgraph.prebuilt.create_react_agent`` with a ``GenericFakeChatModel`` subclass
  (``bind_tools`` returns itself; ``_agenerate`` answers inline rather than in a thread, like our
  scripted model) scripted to return the tool call then the answer, an async ``read`` tool doing
  the same file read, and ``AsyncSqliteSaver`` (``--sync`` adds the sync ``SqliteSaver`` with
  ``invoke``); latency is one ``ainvoke`` / ``invoke``.

Two cases, each sequential with warm-up excluded: a new session (nanocrab) / new thread
(LangGraph) per task, and ``--turns`` tasks in one session / one thread. Prints p50 and mean for
both and the ratio ours / theirs (> 1 means nanocrab is slower), plus the bytes each stores per
turn in the long case (nanocrab: JetStream log stream + SQLite projections; LangGraph: its SQLite
checkpoint file incl. WAL).

Needs the bench extra: ``.venv/bin/pip install -e '.[bench]'``.
Usage: .venv/bin/python bench/langgraph_compare.py [--runs 200] [--turns 500] [--warmup 20] [--sync]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sqlite3
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _agent import NOTES, agent_bench, calibration
from _common import machine, pct

from nanocrab.events import new_event_id

TASK = "what is in notes.txt?"
ANSWER = "notes.txt has ten lines about a fox."


@dataclass
class Result:
    name: str
    new: list[float]
    long: list[float]
    long_bytes: float  # stored per turn in the long case
    cpu_per_run: float  # process CPU seconds per run (new-session case)
    note: str = ""
    context: str = ""  # what the model sees on the last turn of the long case


def p50(values: list[float]) -> float:
    return pct(values, 50)


def describe(values: list[float]) -> str:
    return f"p50 {p50(values) * 1000:7.2f} ms · mean {statistics.fmean(values) * 1000:7.2f} ms"


# -- nanocrab ---------------------------------------------------------------------------------


async def run_nanocrab(runs: int, turns: int, warmup: int) -> Result:
    async with agent_bench("lg-compare") as bench:
        for _ in range(warmup):
            await bench.run_one(bench.task(TASK))
        me = psutil.Process()
        server = next((c for c in me.children() if "nats-server" in c.name()), None)

        def cpu() -> float:
            own = sum(me.cpu_times()[:2])
            return own + (sum(server.cpu_times()[:2]) if server else 0.0)

        c0 = cpu()
        new = [(await bench.run_one(bench.task(TASK)))[0] for _ in range(runs)]
        cpu_per_run = (cpu() - c0) / runs
        _, bytes0 = await bench.stream_state()
        db0 = bench.db_bytes()
        session = new_event_id()
        long = [
            (await bench.run_one(bench.task(TASK, session_id=session)))[0] for _ in range(turns)
        ]
        _, bytes1 = await bench.stream_state()
        db1 = bench.db_bytes()
        failed = {k: v for k, v in bench.watcher.counts.items() if k != "completed"}
        per_turn = (bytes1 - bytes0 + db1 - db0) / turns
        note = (
            f"log {(bytes1 - bytes0) / turns:,.0f} B + SQLite {(db1 - db0) / turns:,.0f} B per turn"
        )
        if failed:
            note += f" · NOT COMPLETED: {failed}"
        last = bench.provider.requests[-1]
        context = (
            f"{last.messages} messages ({last.request_bytes:,} B): the newest 200 session "
            "messages (task and reply texts), then this run's turns"
        )
        return Result("nanocrab", new, long, per_turn, cpu_per_run, note, context)


# -- LangGraph --------------------------------------------------------------------------------


def langgraph_agent(workspace: Path, checkpointer: Any) -> Any:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import StructuredTool
    from langgraph.prebuilt import create_react_agent

    class ToolCallingFakeModel(GenericFakeChatModel):
        """GenericFakeChatModel that accepts tools and answers ``ainvoke`` inline."""

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            return self

        async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def,override]
            return self._generate(messages, stop=stop, **kwargs)

    def script() -> Iterator[AIMessage]:
        for i in itertools.count():
            call = {"name": "read", "args": {"path": "notes.txt"}, "id": f"call_{i}"}
            yield AIMessage(content="", tool_calls=[{**call, "type": "tool_call"}])
            yield AIMessage(content=ANSWER)

    root = workspace.resolve()

    def read_file(path: str) -> str:
        target = (root / path).resolve()
        if not target.is_relative_to(root):
            raise ValueError(f"{path} is outside the workspace")
        return target.read_text(encoding="utf-8")

    async def read_file_async(path: str) -> str:
        return read_file(path)

    tool = StructuredTool.from_function(
        func=read_file,
        coroutine=read_file_async,
        name="read",
        description="Read a text file in the workspace.",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent is deprecated in langgraph 1.x
        return create_react_agent(
            ToolCallingFakeModel(messages=script()), [tool], checkpointer=checkpointer
        )


async def timed_runs(
    call: Callable[[str], Awaitable[Any]], threads: Iterator[str], n: int
) -> list[float]:
    out = []
    for _ in range(n):
        thread = next(threads)
        t = time.perf_counter()
        await call(thread)
        out.append(time.perf_counter() - t)
    return out


def db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


async def run_langgraph_async(tmp: Path, runs: int, turns: int, warmup: int) -> Result:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    inputs = {"messages": [("user", TASK)]}
    me = psutil.Process()
    async with AsyncSqliteSaver.from_conn_string(str(tmp / "lg-new.db")) as saver:
        agent = langgraph_agent(tmp / "ws", saver)

        async def call(thread: str) -> Any:
            out = await agent.ainvoke(inputs, {"configurable": {"thread_id": thread}})
            assert out["messages"][-1].content == ANSWER, out["messages"][-1]
            return out

        fresh = (f"t{i}" for i in itertools.count())
        await timed_runs(call, fresh, warmup)
        c0 = sum(me.cpu_times()[:2])
        new = await timed_runs(call, fresh, runs)
        cpu_per_run = (sum(me.cpu_times()[:2]) - c0) / runs
    long_db = tmp / "lg-long.db"
    async with AsyncSqliteSaver.from_conn_string(str(long_db)) as saver:
        agent = langgraph_agent(tmp / "ws", saver)
        long = await timed_runs(call, itertools.repeat("one-thread"), turns)
        state = await agent.aget_state({"configurable": {"thread_id": "one-thread"}})
    with contextlib.closing(sqlite3.connect(long_db)) as conn:
        checkpoints, blob = conn.execute(
            "SELECT count(*), max(length(checkpoint)) FROM checkpoints"
        ).fetchone()
    note = (
        f"{len(state.values['messages'])} messages in the thread state, {checkpoints} "
        f"checkpoints, the last {blob / 1e3:,.0f} kB, {db_bytes(long_db) / 1e6:,.1f} MB on disk"
    )
    context = (
        f"{len(state.values['messages']) - 1} messages: the whole thread, tool calls and "
        "results included"
    )
    return Result(
        "LangGraph async", new, long, db_bytes(long_db) / turns, cpu_per_run, note, context
    )


def run_langgraph_sync(tmp: Path, runs: int, turns: int, warmup: int) -> Result:
    from langgraph.checkpoint.sqlite import SqliteSaver

    inputs = {"messages": [("user", TASK)]}
    me = psutil.Process()

    def scenario(db: Path, threads: Iterator[str], n: int, skip: int) -> tuple[list[float], float]:
        conn = sqlite3.connect(db, check_same_thread=False)
        try:
            agent = langgraph_agent(tmp / "ws", SqliteSaver(conn))
            for _ in range(skip):
                agent.invoke(inputs, {"configurable": {"thread_id": next(threads)}})
            out = []
            c0 = sum(me.cpu_times()[:2])
            for _ in range(n):
                cfg = {"configurable": {"thread_id": next(threads)}}
                t = time.perf_counter()
                res = agent.invoke(inputs, cfg)
                out.append(time.perf_counter() - t)
                assert res["messages"][-1].content == ANSWER
            return out, (sum(me.cpu_times()[:2]) - c0) / n
        finally:
            conn.close()

    new, cpu_per_run = scenario(tmp / "lgs-new.db", (f"t{i}" for i in itertools.count()), runs,
                                warmup)  # fmt: skip
    long, _ = scenario(tmp / "lgs-long.db", itertools.repeat("one-thread"), turns, 0)
    size = db_bytes(tmp / "lgs-long.db")
    return Result("LangGraph sync", new, long, size / turns, cpu_per_run,
                  f"{size / 1e6:,.1f} MB on disk")  # fmt: skip


# -- report -----------------------------------------------------------------------------------


def report(ours: Result, theirs: Result, runs: int, turns: int, window: int) -> None:
    print(f"\nnanocrab vs {theirs.name}")
    r_new = p50(ours.new) / p50(theirs.new)
    print(
        f"  new session per task ({runs} runs):  nanocrab {describe(ours.new)} | "
        f"{theirs.name} {describe(theirs.new)} | ours/theirs p50 x{r_new:.2f}, "
        f"mean x{statistics.fmean(ours.new) / statistics.fmean(theirs.new):.2f}"
    )
    print(
        f"  CPU per new-session run: nanocrab {ours.cpu_per_run * 1000:.1f} ms (python + "
        f"nats-server) | {theirs.name} {theirs.cpu_per_run * 1000:.1f} ms"
    )
    r_long = statistics.fmean(ours.long) / statistics.fmean(theirs.long)
    print(
        f"  one session/thread, {turns} turns:     nanocrab {describe(ours.long)} | "
        f"{theirs.name} {describe(theirs.long)} | ours/theirs mean x{r_long:.2f}"
    )
    for label, sl in (("first", slice(0, window)), ("last", slice(-window, None))):
        a, b = ours.long[sl], theirs.long[sl]
        print(
            f"    {label} {window} turns: nanocrab p50 {p50(a) * 1000:.2f} ms | {theirs.name} "
            f"p50 {p50(b) * 1000:.2f} ms | ours/theirs x{p50(a) / p50(b):.2f}"
        )
    print(f"  model context on the last turn: nanocrab {ours.context}")
    if theirs.context:
        print(f"  {' ' * 32}{theirs.name} {theirs.context}")
    print(
        f"  stored per turn (one session): nanocrab {ours.long_bytes:,.0f} B ({ours.note}) | "
        f"{theirs.name} {theirs.long_bytes:,.0f} B ({theirs.note}) | ours/theirs "
        f"x{ours.long_bytes / theirs.long_bytes:.3f}"
    )


async def main(runs: int, turns: int, warmup: int, sync: bool) -> None:
    print(f"machine: {machine()} · {calibration()}")
    t0 = time.perf_counter()
    ours = await run_nanocrab(runs, turns, warmup)
    print(f"nanocrab done in {time.perf_counter() - t0:.1f} s")
    others = []
    with tempfile.TemporaryDirectory(prefix="nanocrab-bench-langgraph-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "ws").mkdir()
        (tmp / "ws" / "notes.txt").write_text(NOTES)
        t0 = time.perf_counter()
        others.append(await run_langgraph_async(tmp, runs, turns, warmup))
        print(f"LangGraph async done in {time.perf_counter() - t0:.1f} s")
        if sync:
            t0 = time.perf_counter()
            others.append(run_langgraph_sync(tmp, runs, turns, warmup))
            print(f"LangGraph sync done in {time.perf_counter() - t0:.1f} s")
    window = min(50, turns)
    for theirs in others:
        report(ours, theirs, runs, turns, window)
    print(f"at the end: {calibration()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="tasks, each in a new session/thread")
    ap.add_argument("--turns", type=int, default=500, help="tasks in one session/thread")
    ap.add_argument("--warmup", type=int, default=20, help="runs excluded before measuring")
    ap.add_argument("--sync", action="store_true", help="also LangGraph sync with SqliteSaver")
    a = ap.parse_args()
    asyncio.run(main(a.runs, a.turns, a.warmup, a.sync))
