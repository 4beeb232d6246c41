"""exec in the operating-system sandbox vs unconfined: what confinement costs per command.

Runs `true` and `python3 -c pass` through the exec tool (ToolRegistry → ExecTool →
LocalOperations), confined (the default: Landlock, namespaces, seccomp, limits) and unconfined
(`exec.sandbox: off`), interleaved so both see the same machine load; prints p50/p99 of each
and the p50 overhead. Confined commands are forked by the sandbox's small spawner process, not
by the runtime, so their cost should not grow with the runtime's memory: `--ballast MB` adds
touched memory to this process to show that (a runtime loads more than this script).
`python3` resolves to this interpreter in both modes (its directory leads PATH).
Usage: python bench/exec_confine.py [--runs N] [--ballast MB]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

# bench/ for its helpers, then this checkout ahead of the installed nanocrab (a copy of the
# repository at another commit then measures that commit's code)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from _common import machine, pct

from nanocrab.tools import LocalOperations, ToolContext, ToolRegistry, default_tools
from nanocrab.tools.confine import Confinement, probe
from nanocrab.tools.confine.jail import SandboxStatus

COMMANDS = ("true", "python3 -c pass")


async def _null_artifacts(name: str, data: bytes, **_: object) -> None:
    raise AssertionError("no artifacts expected")


class _NoArtifacts:
    put = staticmethod(_null_artifacts)


Samples = dict[tuple[str, bool], list[float]]


async def run(runs: int, workspace: Path, status: SandboxStatus) -> Samples:
    async def known() -> SandboxStatus:
        return status

    ops = LocalOperations(sandbox_status=known)
    registry = ToolRegistry(default_tools())
    modes = {True: Confinement(), False: Confinement(required=False)}
    samples: Samples = {(c, m): [] for c in COMMANDS for m in modes}
    for command in COMMANDS:
        for conf in modes.values():  # warm-up
            ctx = ToolContext(workspace=workspace, ops=ops, artifacts=_NoArtifacts(),
                              confinement=conf)  # fmt: skip
            await registry.invoke("exec", {"command": command}, ctx)
        for i in range(runs):
            order = list(modes.items()) if i % 2 else list(modes.items())[::-1]
            for confined, conf in order:  # alternate which goes first
                ctx = ToolContext(workspace=workspace, ops=ops, artifacts=_NoArtifacts(),
                                  confinement=conf)  # fmt: skip
                started = time.perf_counter()
                result = await registry.invoke("exec", {"command": command}, ctx)
                samples[(command, confined)].append(time.perf_counter() - started)
                assert not result.is_error, result
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--ballast", type=int, default=0, help="MB of touched memory to add")
    args = parser.parse_args()
    ballast = bytearray(args.ballast * 1024 * 1024)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
    status = probe()
    if not status.available:
        sys.exit(f"no sandbox on this host: {status.detail}")
    rss_mb = int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20
    print(f"machine: {machine()}; sandbox: {status.detail}")
    print(f"runs: {args.runs} per command and mode, interleaved; this process: {rss_mb:.0f} MB RSS")
    with tempfile.TemporaryDirectory(prefix="nanocrab-bench-exec-") as tmp:
        samples = asyncio.run(run(args.runs, Path(tmp).resolve(), status))
    for command in COMMANDS:
        ms = {m: [s * 1000 for s in samples[(command, m)]] for m in (True, False)}
        for confined in (False, True):
            label = "confined  " if confined else "unconfined"
            v = ms[confined]
            print(f"{command:18} {label}  p50 {pct(v, 50):7.2f} ms · p99 {pct(v, 99):7.2f} ms")
        print(f"{command:18} overhead    p50 {pct(ms[True], 50) - pct(ms[False], 50):7.2f} ms")
    del ballast


if __name__ == "__main__":
    main()
