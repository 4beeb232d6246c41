"""A long session: many consecutive one-tool tasks in ONE session (same ``session_id``).

Each task is a full agent run (scripted model, zero model latency: ``read notes.txt``, then an
answer) on the real handlers, default ``RuntimeOptions`` and all projections on SQLite. The LLM
handler rebuilds each request from the session's history, read from the sessions projection
(SQLite), so the conversation grows with every task. Runs are sequential; a few warm-up runs in
other sessions come first so the "first 50" are not cold-start runs.

Prints: per-turn latency (task.submitted → run.completed seen by a subscriber) of the first and
last 50 turns (target: last within 1.5x of first), how latency and the model request (messages,
encoded bytes) grow along the session, bytes stored per turn (JetStream log stream bytes / runs,
target none given; also the SQLite projections file), and whether any request missed part of the
session's history (the sessions projection lagging behind the log).

Usage: .venv/bin/python bench/long_session.py [--turns 500] [--window 50] [--warmup 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _agent import CpuMeter, agent_bench, calibration
from _common import machine, pct

from nanocrab.bus import read_run
from nanocrab.events import new_event_id

# added by the server to a direct-get reply; not part of the stored message
DIRECT_GET_HEADERS = {"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp",
                      "Nats-Num-Pending", "Nats-Last-Sequence"}  # fmt: skip
HISTORY_LIMIT_ROWS = 200  # nanocrab.projections.session_history(limit=200)


def ms(values: list[float]) -> str:
    v = [x * 1000 for x in values]
    return f"p50 {pct(v, 50):.2f} ms · p99 {pct(v, 99):.2f} ms · mean {statistics.fmean(v):.2f} ms"


async def main(turns: int, window: int, warmup: int) -> None:
    print(f"machine: {machine()} · {calibration()}")
    async with agent_bench("long-session") as bench:
        for _ in range(warmup):
            await bench.run_one(bench.task())
        msgs0, bytes0 = await bench.stream_state()
        db0 = bench.db_bytes()
        session = new_event_id()
        lat: list[float] = []
        runs: list[str] = []
        outcomes: dict[str, int] = {}
        cpu = CpuMeter(bench.log.nc)
        for _ in range(turns):
            task = bench.task(session_id=session)
            secs, outcome = await bench.run_one(task)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            lat.append(secs)
            runs.append(task.run_id or "")
        cpu.stop()
        msgs1, bytes1 = await bench.stream_state()
        db1 = bench.db_bytes()

        by_run: dict[tuple[str, int], tuple[int, int]] = {}
        for r in bench.provider.requests:
            by_run[(r.run_id, r.turn)] = (r.messages, r.request_bytes)
        stale = []
        for i, rid in enumerate(runs):
            expected = min(2 * i, HISTORY_LIMIT_ROWS) + 1  # earlier user+assistant pairs + task
            got = by_run.get((rid, 0), (0, 0))[0]
            if got != expected:
                stale.append((i + 1, got, expected))

        print(f"one session, {turns} consecutive one-tool tasks · outcomes: {outcomes}")
        print(cpu.report(turns, "turn"))
        print(f"  {'turns':>11}  {'latency p50':>11} {'mean':>9}  {'request msgs':>12} "
              f"{'request bytes':>13} (turn 0 of the run → turn 1)")  # fmt: skip
        step = max(window, turns // 10)
        for start in range(0, turns, step):
            chunk = lat[start : start + window]
            first = by_run.get((runs[start], 0), (0, 0))
            second = by_run.get((runs[start], 1), (0, 0))
            print(
                f"  {start + 1:>4}-{start + len(chunk):<6} {pct(chunk, 50) * 1000:9.2f}ms "
                f"{statistics.fmean(chunk) * 1000:7.2f}ms  {first[0]:>5} → {second[0]:<5} "
                f"{first[1]:>6,} → {second[1]:<7,}"
            )
        head, tail = lat[:window], lat[-window:]
        ratio = pct(tail, 50) / pct(head, 50)
        mean_ratio = statistics.fmean(tail) / statistics.fmean(head)
        verdict = "OK" if ratio <= 1.5 else "MISSED"
        print(f"first {window} turns: {ms(head)}")
        print(f"last {window} turns:  {ms(tail)}")
        print(
            f"last/first {window}: p50 x{ratio:.2f}, mean x{mean_ratio:.2f} · target <= 1.5 · "
            f"{verdict}"
        )
        last = by_run.get((runs[-1], 1), (0, 0))
        print(
            f"model request growth: turn 1 of the first task has {by_run[(runs[0], 1)][0]} "
            f"messages, of the last task {last[0]} messages ({last[1]:,} bytes); history is "
            f"capped at the newest {HISTORY_LIMIT_ROWS} session messages"
        )
        print(
            f"bytes stored per turn: log stream {(bytes1 - bytes0) / turns:,.0f} B "
            f"({(msgs1 - msgs0) / turns:.1f} events/turn) · SQLite projections "
            f"{(db1 - db0) / turns:,.0f} B/turn (file incl. WAL, grows in pages)"
        )
        sizes = []
        for st in await read_run(bench.log, runs[-1]):
            raw = await bench.log.get(st.seq)
            head_bytes = sum(
                len(k) + len(v) + 4 for k, v in raw.headers.items() if k not in DIRECT_GET_HEADERS
            )
            sizes.append((st.event.type if st.event else "?", len(raw.data), head_bytes))
        print(
            "  last run's events (CloudEvents JSON payload + NATS headers): "
            + ", ".join(f"{t} {d:,}+{h}" for t, d, h in sizes)
        )
        if stale:
            shown = ", ".join(f"turn {t}: {g} msgs, expected {e}" for t, g, e in stale[:5])
            print(
                f"STALE HISTORY: {len(stale)} of {turns} requests saw fewer session messages "
                f"than the session had ({shown}{', …' if len(stale) > 5 else ''})"
            )
        else:
            print("history: every request saw the whole (capped) session history")
    print(f"at the end: {calibration()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=500, help="tasks in the one session")
    ap.add_argument("--window", type=int, default=50, help="size of the first/last windows")
    ap.add_argument("--warmup", type=int, default=20, help="runs in other sessions first")
    a = ap.parse_args()
    asyncio.run(main(a.turns, a.window, a.warmup))
