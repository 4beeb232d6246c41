"""CLI start-up: what a user waits for before nanocrab does anything.

Every figure is a new process, as a user runs it:

* ``nanocrab --help``: wall time (median of ``--runs``) and peak RSS;
* ``import nanocrab.cli.app`` (what every command imports before it runs): time measured inside
  the process, modules loaded, peak RSS, and which heavy libraries it loaded (none, if the
  commands import what they use when they run: tests/test_cli_lazy.py);
* ``nanocrab run "list the files"`` end to end on a cold embedded server: a fresh
  ``NANOCRAB_HOME`` and working directory per run, so the server starts, the keys and the
  SQLite database are created, and the offline scripted model answers (no API key).

The machine is shared: the load average is printed with the figures; compare before/after in
the same minute.

Usage: .venv/bin/python bench/cli_startup.py [--runs 7] [--run-runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
NANOCRAB = VENV_BIN / "nanocrab"
HEAVY = ("sqlalchemy", "bashlex", "nats", "anthropic", "wasmtime", "opentelemetry", "pydantic")

IMPORT_PROBE = f"""
import sys, time, resource
before = set(sys.modules)
t = time.perf_counter()
import nanocrab.cli.app
elapsed = time.perf_counter() - t
heavy = [m for m in {HEAVY!r} if m in sys.modules]
print(elapsed, len(set(sys.modules) - before), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      ",".join(heavy) or "-")
"""


def timed(
    argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[float, int, str]:
    """Wall seconds, exit code and stdout of one new process (peak RSS: :func:`rss_kib`)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    out, _ = proc.communicate()
    return time.perf_counter() - start, proc.returncode, out


def rss_kib(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> int:
    """Peak RSS of one new process running ``argv`` (its own, via wait4)."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped by wait4, so Popen does not wait for it again
    return usage.ru_maxrss


def median_s(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f},"
        f" n={len(values)})"
    )


def clean_env(home: Path | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ANTHROPIC_API_KEY", "NANOCRAB_PROVIDER", "NANOCRAB_NATS_URL")
        and not k.startswith("NANOCRAB_")
    }
    env["COLUMNS"] = "100"
    if home is not None:
        env["NANOCRAB_HOME"] = str(home)
    return env


def main(runs: int, run_runs: int) -> None:
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()} · load average {load}"
    )
    env = clean_env()

    help_s = []
    for _ in range(runs):
        elapsed, code, out = timed([str(NANOCRAB), "--help"], env=env)
        assert code == 0 and "Commands" in out, f"nanocrab --help failed ({code})"
        help_s.append(elapsed)
    help_rss = rss_kib([str(NANOCRAB), "--help"], env=env)
    print(f"nanocrab --help: {median_s(help_s)} · peak RSS {help_rss / 1024:.0f} MiB")

    import_s, loaded, rss, heavy = [], 0, 0, "-"
    for _ in range(runs):
        # -P: import the installed nanocrab, not a ./nanocrab in the current directory
        _, code, out = timed([sys.executable, "-P", "-c", IMPORT_PROBE], env=env)
        assert code == 0, "import nanocrab.cli.app failed"
        seconds, count, peak, heavy = out.split()
        import_s.append(float(seconds))
        loaded, rss = int(count), int(peak)
    print(
        f"import nanocrab.cli.app: {median_s(import_s)} · {loaded} modules · peak RSS "
        f"{rss / 1024:.0f} MiB · heavy libraries loaded: {heavy}"
    )

    run_s = []
    run_rss = 0
    for i in range(run_runs):
        with tempfile.TemporaryDirectory(prefix="nanocrab-cli-startup-") as tmp:
            cwd = Path(tmp) / "work"
            cwd.mkdir()
            argv = [str(NANOCRAB), "run", "list the files"]
            if i == 0:
                run_rss = rss_kib(argv, cwd=cwd, env=clean_env(Path(tmp) / "home-rss"))
            elapsed, code, out = timed(argv, cwd=cwd, env=clean_env(Path(tmp) / "home"))
            assert code == 0 and "answer:" in out, f"nanocrab run failed ({code}): {out[-500:]}"
            run_s.append(elapsed)
    print(
        f'nanocrab run "list the files" (cold embedded server, new NANOCRAB_HOME, offline '
        f"model): {median_s(run_s)} · peak RSS {run_rss / 1024:.0f} MiB"
    )
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"load average after: {load}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="--help and import runs")
    parser.add_argument("--run-runs", type=int, default=3, help="cold `nanocrab run` runs")
    ns = parser.parse_args()
    main(ns.runs, ns.run_runs)
