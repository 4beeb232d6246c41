"""The sandbox's value objects: what a run may use (:class:`Limits`), what it sees
(:class:`Mount`), and what came of it (:class:`SandboxResult`, with a typed :data:`Outcome`).

Every guest failure is an :data:`Outcome`, never an exception; :class:`SandboxError` is kept for
set-up problems on the host (no interpreter, a mount that does not exist, bad limits).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Outcome = Literal["ok", "exit_code", "out_of_fuel", "timeout", "memory", "stack", "error"]
"""How a run ended.

``ok``           the interpreter exited with status 0.
``exit_code``    it exited with another status (an uncaught exception is status 1).
``out_of_fuel``  it executed more WebAssembly instructions than ``Limits.fuel`` allows.
``timeout``      it ran past ``Limits.timeout_s`` of wall-clock time (sleeping included).
``memory``       it needed more linear memory than ``Limits.memory_bytes`` (a ``MemoryError``
                 in the guest, or an abort while memory was at the limit).
``stack``        it overflowed the WebAssembly stack (``Limits.stack_bytes``), e.g. deep
                 recursion through C code after ``sys.setrecursionlimit``.
``error``        any other trap (an abort, a crash in the interpreter) or a failure to
                 instantiate; ``detail`` says which.
"""

RESERVED_GUEST_PATHS = ("/usr/local/lib",)  # where the interpreter's standard library is mounted
WASM_PAGE = 64 * 1024
# wasmtime refuses (with a panic that kills the process) a max_wasm_stack above its 2 MiB
# async stack size, so larger values are rejected here.
MAX_STACK_BYTES = 2 * 2**20


class SandboxError(Exception):
    """A set-up problem on the host: the interpreter is missing, a mount or the limits are
    unusable, the cache directory cannot be written. Never raised for anything the guest does."""


@dataclass(frozen=True)
class Mount:
    """A host directory the guest sees at ``guest`` (an absolute POSIX path).

    Read-only unless ``writable``. The guest cannot leave it: ``..`` and symlinks that point
    outside it are refused by wasmtime's capability-based file system (cap-std).
    """

    host: Path
    guest: str
    writable: bool = False

    def __post_init__(self) -> None:
        guest = self.guest
        if not guest.startswith("/") or posixpath.normpath(guest) != guest or guest == "/":
            raise SandboxError(
                f"mount guest path {guest!r} must be an absolute, normalised path other than "
                "'/', e.g. '/workspace'"
            )
        if any(guest == r or guest.startswith(r + "/") for r in RESERVED_GUEST_PATHS):
            raise SandboxError(f"mount guest path {guest!r} is reserved for the standard library")


@dataclass(frozen=True)
class Limits:
    """What one run may use. Every limit ends the run with its own :data:`Outcome`.

    ``fuel``          WebAssembly instructions, roughly (wasmtime fuel); ``out_of_fuel``.
                      CPython's start-up alone costs ~60 million.
    ``timeout_s``     wall-clock seconds, enforced by epoch interruption (10 ms ticks) and by
                      cutting guest sleeps short; ``timeout``.
    ``memory_bytes``  linear memory; the interpreter starts at 10 MiB; ``memory``.
    ``stack_bytes``   the WebAssembly (native) stack, at most 2 MiB; ``stack``. An engine
                      setting: a run whose value differs from the Sandbox's uses another
                      engine. CPython's own C stack is a fixed 512 KiB of linear memory; past
                      ~1 MiB here, that one overflows first (also ``stack``).
    ``output_bytes``  kept per stream (stdout, stderr); the rest is counted and dropped, and
                      the result's ``*_truncated`` flag is set.
    ``result_bytes``  what a structured call (``run_python``, ``call_function``) may send
                      back through its result channel, the JSON of its value, in all; held in
                      memory, never on disk. Past it the guest's write fails and the call's
                      error says so (``CallResult.channel_error == "too_large"``). Not used by
                      ``Sandbox.run``.
    """

    fuel: int = 2_000_000_000
    timeout_s: float = 5.0
    memory_bytes: int = 256 * 2**20
    stack_bytes: int = 512 * 1024
    output_bytes: int = 64 * 1024
    result_bytes: int = 8 * 2**20

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be positive"
            for name in ("fuel", "timeout_s", "memory_bytes", "stack_bytes", "result_bytes")
            if getattr(self, name) <= 0
        ]
        if self.output_bytes < 0:
            problems.append("output_bytes must not be negative")
        if self.stack_bytes > MAX_STACK_BYTES:
            problems.append(f"stack_bytes must be at most {MAX_STACK_BYTES:,} (2 MiB)")
        if problems:
            raise SandboxError(f"invalid sandbox limits: {'; '.join(problems)}")

    @property
    def deadline_ticks(self) -> int:
        """Epoch ticks (10 ms each) the run may last, at least one."""
        return max(1, -(-round(self.timeout_s * 1000) // 10))


@dataclass(frozen=True)
class SandboxResult:
    """What one run did. ``stdout``/``stderr`` are decoded as UTF-8 (invalid bytes replaced)
    and hold at most ``Limits.output_bytes`` bytes each. ``exit_code`` is set when the
    interpreter exited (``ok``/``exit_code``, and ``memory`` when it exited on a MemoryError),
    else ``None``. ``fuel_used`` counts fuel consumed including interpreter start-up;
    ``peak_memory_bytes`` is the size of linear memory at the end (it never shrinks)."""

    outcome: Outcome
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: float
    peak_memory_bytes: int
    fuel_used: int
    detail: str

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"
