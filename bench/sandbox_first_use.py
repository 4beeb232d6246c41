"""First sandbox use in fresh processes: does any of them abort?

Launches N new Python processes, a few at a time (the parallelism adds load), each doing the
sandbox's first-use path once with the compiled interpreter already cached: import, construct,
warm, one run, exit. Counts how each process ended (exit status or signal) and prints the
stderr of every one that did not exit 0. Exit status 0 only when all of them did.

Usage: python bench/sandbox_first_use.py [--launches N] [--parallel P] [--burn B]
       [--cache DIR] [--workload run|python] [--show K]
``run``: ``Sandbox.run("print('hello')")`` (bench/sandbox.py's first-use path); ``python``:
``run_python`` with a writable mount and a final value (the python tool's path). ``--burn B``
keeps B busy-looping processes running meanwhile. Load makes wasmtime's worker threads lag
behind the main thread, which is what exposes the process-exit race (docs/sandbox.md, "Process
exit").
"""

from __future__ import annotations

import argparse
import collections
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nanocrab.sandbox import Sandbox

FIRST_USE = """
import asyncio, sys, tempfile
from nanocrab.sandbox import Mount, Sandbox, run_python
box = Sandbox(sys.argv[1])
box.warm()
assert box.cache_hit, "the interpreter was compiled, not loaded from the cache"
if sys.argv[2] == "run":
    result = asyncio.run(box.run("print('hello')"))
    assert result.stdout == "hello\\n", result
else:
    with tempfile.TemporaryDirectory() as ws:
        mount = Mount(ws, "/workspace", writable=True)
        call = asyncio.run(run_python(box, "open('x', 'w').write('y')", mounts=[mount]))
        assert call.ok and call.value == 1 and call.files_written == ["x"], call
"""
# Nothing may run after the workload: any Python code at exit (even an atexit hook) gives a
# wasmtime thread waiting for the GIL its turn before finalisation starts, hiding the race.


def launch(cache: Path, workload: str) -> tuple[int, str]:
    """(the process's return code — negative for a signal — and its stderr)."""
    args = [sys.executable, "-c", FIRST_USE, str(cache), workload]
    proc = subprocess.run(args, capture_output=True, timeout=300)
    return proc.returncode, proc.stderr.decode(errors="replace")


def describe(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit {code}"


def main(launches: int, parallel: int, burn: int, cache: Path, workload: str, show: int) -> int:
    box = Sandbox(cache)
    box.warm()  # compile and cache once, so every launch is a cache hit
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burn)]
    started = time.perf_counter()
    ends: collections.Counter[str] = collections.Counter()
    failures: list[tuple[int, str]] = []
    try:
        with ThreadPoolExecutor(parallel) as pool:
            ends_of = pool.map(lambda _: launch(cache, workload), range(launches))
            for code, stderr in ends_of:
                ends[describe(code)] += 1
                if code != 0:
                    failures.append((code, stderr))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    took = time.perf_counter() - started
    summary = ", ".join(f"{name}: {n}" for name, n in ends.most_common())
    print(
        f"{launches} first uses ({workload}), {parallel} at a time, {burn} CPU burners, "
        f"{took:.0f} s: {summary}"
    )
    for code, stderr in failures[:show]:
        print(f"--- {describe(code)} ---\n{stderr.strip()[-3000:]}")
    return 0 if not failures else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=500)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--burn", type=int, default=0, help="busy-looping processes alongside")
    ap.add_argument("--cache", type=Path, default=None, help="default: a new temp directory")
    ap.add_argument("--workload", choices=("run", "python"), default="run")
    ap.add_argument("--show", type=int, default=3, help="failures whose stderr is printed")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nanocrab-first-use-") as tmp:
        cache = a.cache or Path(tmp) / "cache"
        sys.exit(main(a.launches, a.parallel, a.burn, cache, a.workload, a.show))
