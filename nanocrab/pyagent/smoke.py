"""Validating a Python agent's module in a subprocess: import it, find its class, run its
smoke tests (``async def smoke(harness)``), under a time limit.

``python -m nanocrab.pyagent.smoke PATH [CLASS]`` prints one JSON object,
``{"ok": bool, "line": int, "message": str}`` (``line``: where in the module it failed, 0 when
unknown) and exits 0 when it passes. :func:`check` runs it and kills it at the time limit, so a
module that hangs, crashes the interpreter or exits cannot take the validator with it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class SmokeOutcome:
    ok: bool
    message: str = ""
    line: int = 0


def check(
    path: Path, class_name: str | None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> SmokeOutcome:
    """Import ``path`` and run its smoke tests in a fresh interpreter (cwd: its directory)."""
    argv = [sys.executable, "-m", "nanocrab.pyagent.smoke", str(path)]
    if class_name:
        argv.append(class_name)
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, cwd=path.parent,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return SmokeOutcome(False, f"the import and smoke tests took longer than {timeout_s:g} s")
    last = done.stdout.strip().splitlines()[-1:] or [""]
    try:
        report = json.loads(last[0])
        return SmokeOutcome(bool(report["ok"]), str(report["message"]), int(report["line"]))
    except (ValueError, KeyError, TypeError):
        tail = (done.stderr or done.stdout).strip()[-500:]
        return SmokeOutcome(False, f"the smoke process exited {done.returncode}: {tail}")


def _line_in(exc: BaseException, path: Path) -> int:
    """The last line of ``path`` in ``exc``'s traceback (a syntax error's own line)."""
    if isinstance(exc, SyntaxError) and exc.lineno:
        return exc.lineno
    line = 0
    target = str(path.resolve())
    seen: BaseException | None = exc
    while seen is not None:
        for frame in traceback.extract_tb(seen.__traceback__):
            if str(Path(frame.filename).resolve()) == target and frame.lineno:
                line = frame.lineno
        seen = seen.__cause__
        if line:
            break
    return line


async def _main(path: Path, class_name: str | None) -> tuple[bool, str, int]:
    from nanocrab.pyagent.code import AgentLoadError, load
    from nanocrab.pyagent.harness import Harness

    try:
        loaded = load(path, class_name)
    except AgentLoadError as exc:
        cause = exc.__cause__ or exc
        return False, str(exc).removeprefix(f"{path}: "), _line_in(cause, path)
    if loaded.smoke is None:
        return True, "imported; no smoke tests", 0
    try:
        await loaded.smoke(Harness(loaded.agent, name=path.stem))
    except AssertionError as exc:
        return False, f"smoke test failed: {exc or 'assertion'}", _line_in(exc, path)
    except Exception as exc:  # the module's code: report whatever it raised
        return False, f"smoke test raised {type(exc).__name__}: {exc}", _line_in(exc, path)
    return True, "smoke tests passed", 0


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    ok, message, line = asyncio.run(_main(path, argv[1] if len(argv) > 1 else None))
    print(json.dumps({"ok": ok, "message": message, "line": line}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
