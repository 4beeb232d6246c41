"""The dynamic half: a module's tests, and invocations, run in the WASM sandbox.

Each ``test_*`` function runs in a fresh sandbox instance of its own (~0.1 s each), so a test
that loops forever or exhausts memory is named in the result instead of taking the others down
with it. A limit the sandbox enforces comes back as that test's typed outcome.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nanocrab.capabilities.invoke import LIMIT_HINTS
from nanocrab.events import CapabilityFinding, CapabilityTestResult
from nanocrab.sandbox import Limits, Mount, Outcome, Sandbox, call_function

TEST_LIMITS = Limits(fuel=1_000_000_000, timeout_s=5.0, memory_bytes=100 * 2**20)
"""Per test: ~16x the interpreter's start-up in fuel, 5 s, 100 MiB (seed 001: CPU 5 s,
memory 100 MB)."""

MODULE_FILENAME = "<capability>"
WORKDIR = "/data"
"""Where a module with file permissions finds its directory (its working directory)."""
FILE_PERMISSIONS = frozenset({"fs.read", "fs.write"})

HARNESS = f"""
import traceback

FILENAME = {MODULE_FILENAME!r}


def _describe(exc):
    line = 0
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == FILENAME:
            line = frame.lineno
    text = type(exc).__name__ + (": " + str(exc) if str(exc) else "")
    return text + (" (line %d)" % line if line else "")


def run_test(code, name):
    namespace = {{"__name__": "capability"}}
    try:
        exec(compile(code, FILENAME, "exec"), namespace)
    except BaseException as exc:
        return {{"passed": False, "error": "the module failed to load: " + _describe(exc)}}
    test = namespace.get(name)
    if not callable(test):
        return {{"passed": False, "error": name + " is not a function"}}
    try:
        test()
    except BaseException as exc:
        return {{"passed": False, "error": _describe(exc)}}
    return {{"passed": True, "error": ""}}
"""
"""Loads the module text under :data:`MODULE_FILENAME` (so tracebacks name its own lines)
and runs one test; the generated code itself never sees ``exec``: the scanner forbids it."""

SANDBOX_RULES = frozenset({"out_of_fuel", "timeout", "memory", "stack", "sandbox_error"})
"""Finding rules :func:`run_tests` adds; the test results already say the same per test."""


@dataclass(frozen=True)
class ModuleTests:
    """The tests of one module: a result per test; a finding for each test the sandbox stopped
    (a limit, or a crash of the harness) — a failing assert is only in its test's result."""

    tests: list[CapabilityTestResult]
    findings: list[CapabilityFinding]
    outcome: Outcome
    duration_ms: float

    @property
    def passed(self) -> bool:
        return bool(self.tests) and all(t.passed for t in self.tests)


async def run_tests(
    sandbox: Sandbox,
    source: str,
    names: Sequence[str],
    *,
    limits: Limits = TEST_LIMITS,
    scratch: bool = False,
) -> ModuleTests:
    """Run each of ``names`` (the module's ``test_*`` functions) in its own sandbox;
    ``scratch``: in an empty writable working directory of its own (for modules with file
    permissions)."""
    started = time.perf_counter()
    results: list[CapabilityTestResult] = []
    findings: list[CapabilityFinding] = []
    worst: Outcome = "ok"
    for name in names:
        with tempfile.TemporaryDirectory(prefix="nanocrab-captest-") as workdir:
            mounts = [Mount(Path(workdir), WORKDIR, writable=True)] if scratch else []
            call = await call_function(
                sandbox, HARNESS, "run_test", {"code": source, "name": name},
                mounts=mounts, limits=limits,
            )  # fmt: skip
        outcome = call.sandbox.outcome
        value = call.value if call.ok and isinstance(call.value, dict) else None
        if value is not None:
            passed, error = bool(value.get("passed")), str(value.get("error") or "")
        else:
            passed = False
            if outcome in LIMIT_HINTS:
                rule: str = outcome
                error = LIMIT_HINTS[outcome]
            else:
                rule = "sandbox_error"
                error = call.error or call.sandbox.detail or f"the sandbox ended with {outcome}"
            findings.append(CapabilityFinding(rule=rule, message=f"{name}: {error}"))
        if outcome != "ok" and worst == "ok":
            worst = outcome
        results.append(CapabilityTestResult(name=name, passed=passed, error=error))
    return ModuleTests(
        tests=results,
        findings=findings,
        outcome=worst,
        duration_ms=(time.perf_counter() - started) * 1000,
    )
