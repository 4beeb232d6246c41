"""The ``python`` tool: a cell of Python run in the WebAssembly sandbox, never on the host.

The run's workspace is mounted at ``/workspace`` (the working directory), read-only unless the
tool was built with ``writable_workspace=True`` or the call says ``write: true``; only the
standard library is importable; there is no network, no subprocess and no thread. Writable or
not, the code cannot leave a symlink pointing out of the workspace for later tools to follow:
it cannot create links, and one it moved out is removed. See docs/sandbox.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from nanocrab.events import PythonDetails
from nanocrab.sandbox import CallResult, Limits, Mount, Sandbox, SandboxError, run_python
from nanocrab.tools.base import ToolArgs, ToolContext, ToolError, ToolResult

MAX_TIMEOUT_S = 60.0
WORKSPACE_GUEST = "/workspace"
# ~2 s of guest CPU per 10 s of wall clock (the guest burns 8-12 billion fuel a second); a
# larger timeout_s scales the fuel with it, so the timeout is the limit the model controls.
TOOL_LIMITS = Limits(fuel=20_000_000_000, timeout_s=10.0, output_bytes=32 * 1024)
_MAX_VALUE_CHARS = 16_000


def default_cache_dir() -> Path:
    """Where the compiled interpreter is cached when no directory is given (per user)."""
    return Path.home() / ".cache" / "nanocrab" / "sandbox"


class PythonArgs(ToolArgs):
    code: str = Field(
        min_length=1,
        description=(
            "Python 3.11 source, run like a notebook cell: the value of a final expression is "
            "returned as JSON. Print anything else you need to see."
        ),
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="Wall-clock seconds before the code is stopped (default 10; max 60).",
    )
    write: bool = Field(
        default=False,
        description=(
            "Mount the workspace writable so the code can create or change files there. Only "
            "when needed: a person is asked to approve it first."
        ),
    )


class PythonTool:
    """Runs ``code`` with :func:`nanocrab.sandbox.run_python` against the run's workspace.

    One :class:`~nanocrab.sandbox.Sandbox` per tool, warmed on first use (the compiled
    interpreter is cached in ``cache_dir``). A non-ok outcome is an error result: ``timeout``
    for the wall clock, ``aborted`` when ``ctx.cancel`` is set (the guest itself runs on until
    its own limits stop it), ``failed`` for everything else (an exception, running out of fuel,
    memory or stack). A final value that is not JSON-serialisable is reported, not an error.
    Symlinks the code left pointing outside the workspace were removed by the sandbox; the text
    names them (they are not in ``files_written``). A value over the result channel's cap
    (``Limits.result_bytes``) is ``failed``, saying so.
    """

    name: ClassVar[str] = "python"
    group: ClassVar[str] = "sandbox"
    description: ClassVar[str] = (
        "Run Python 3.11 code in an isolated WebAssembly sandbox and return its stdout, stderr "
        "and the value of its last expression as JSON. The workspace is read-only at "
        "/workspace (the working directory). Only the standard library is available: no "
        "network, subprocesses, threads or pip. Limits: timeout_s of wall clock (default 10 "
        "s), a CPU budget that scales with it, 256 MiB of memory, 32 KB of output per stream."
    )
    args_model: ClassVar[type[ToolArgs]] = PythonArgs
    idempotent: ClassVar[bool] = False  # may write the workspace (write: true)

    def __init__(
        self,
        cache_dir: Path | None = None,
        *,
        limits: Limits = TOOL_LIMITS,
        writable_workspace: bool = False,
        sandbox: Sandbox | None = None,
    ) -> None:
        """``sandbox``: one shared by the process (every call passes its own limits)."""
        self.limits = limits
        self.writable_workspace = writable_workspace
        self.sandbox = sandbox or Sandbox(cache_dir or default_cache_dir(), limits=limits)

    async def run(self, args: PythonArgs, ctx: ToolContext) -> ToolResult:
        timeout_s = min(args.timeout_s or self.limits.timeout_s, ctx.timeout_s, MAX_TIMEOUT_S)
        scale = max(1.0, timeout_s / self.limits.timeout_s)
        limits = replace(self.limits, timeout_s=timeout_s, fuel=int(self.limits.fuel * scale))
        call = asyncio.ensure_future(
            self._execute(
                args.code, ctx.workspace, limits, writable=self.writable_workspace or args.write
            )
        )
        cancelled = asyncio.ensure_future(ctx.cancel.wait())
        try:
            await asyncio.wait({call, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if not call.done():
            call.add_done_callback(_discard_result)
            return ToolResult.error(
                "aborted", "[aborted: the run was cancelled; the sandboxed code was abandoned]"
            )
        return _to_result(call.result(), limits)

    async def _execute(
        self, code: str, workspace: Path, limits: Limits, *, writable: bool = False
    ) -> CallResult:
        """Run ``code`` with ``workspace`` at /workspace, read-only unless ``writable``. The
        first call warms the sandbox (loads the cached interpreter, or compiles it: ~4 s)."""
        mount = Mount(workspace, WORKSPACE_GUEST, writable=writable)
        try:
            return await run_python(self.sandbox, code, mounts=[mount], limits=limits)
        except SandboxError as exc:
            raise ToolError("failed", f"The Python sandbox is unavailable: {exc}") from exc


def _discard_result(task: asyncio.Future[CallResult]) -> None:
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()


_STOPPED = {
    "out_of_fuel": "stopped: out of fuel (the CPU budget ran out; do less work per call)",
    "memory": "stopped: out of memory",
    "stack": "stopped: stack overflow (recursion too deep)",
}


def _to_result(call: CallResult, limits: Limits) -> ToolResult:
    result = call.sandbox
    details = PythonDetails(
        outcome=result.outcome, duration_ms=result.duration_ms,
        peak_memory_bytes=result.peak_memory_bytes, fuel_used=result.fuel_used,
        stdout_truncated=result.stdout_truncated, stderr_truncated=result.stderr_truncated,
        files_written=list(call.files_written),
    )  # fmt: skip
    parts: list[str] = []
    for label, text, truncated in (
        ("stdout", result.stdout, result.stdout_truncated),
        ("stderr", result.stderr, result.stderr_truncated),
    ):
        if text or truncated:
            note = f"\n[{label} truncated at {limits.output_bytes:,} bytes]" if truncated else ""
            parts.append(f"{label}:\n{text.rstrip(chr(10))}{note}")
    if call.ok and call.value is not None:
        shown = json.dumps(call.value, ensure_ascii=False)
        if len(shown) > _MAX_VALUE_CHARS:
            shown = shown[:_MAX_VALUE_CHARS] + " …[value truncated]"
        parts.append(f"result: {shown}")
    if call.links_removed:
        parts.append(
            "[removed symlinks that pointed outside the workspace: "
            f"{', '.join(call.links_removed)}]"
        )
    if call.channel_error == "too_large":
        parts.append(
            f"[error: {call.error}. Return a smaller value: print a summary, or pass "
            "write: true and save the data to a file in the workspace.]"
        )
        return ToolResult.error("failed", "\n\n".join(parts), details=details)
    if result.outcome == "ok":
        if not call.ok and call.error:
            parts.append(f"result: {call.error}")
        return ToolResult.text("\n\n".join(parts) or "(no output)", details=details)
    if result.outcome == "timeout":
        parts.append(
            f"[stopped: timed out after {limits.timeout_s:g} s. Pass a larger timeout_s "
            f"(max {MAX_TIMEOUT_S:g}) or do less work per call.]"
        )
        return ToolResult.error("timeout", "\n\n".join(parts), details=details)
    if result.outcome == "exit_code":
        parts.append(f"[error: {call.error}]")
    else:
        stopped = _STOPPED.get(result.outcome, "stopped: the sandbox failed")
        parts.append(f"[{stopped} — {result.detail}]")
    return ToolResult.error("failed", "\n\n".join(parts), details=details)
