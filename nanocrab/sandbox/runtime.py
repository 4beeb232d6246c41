"""Running CPython-for-WASI under wasmtime: the :class:`Sandbox`, one run, its outcome.

A :class:`Sandbox` owns a wasmtime engine (fuel, epoch interruption, a WebAssembly stack
limit; one more per other ``stack_bytes`` asked for) and the interpreter compiled for it,
loaded from the on-disk cache (:mod:`.cache`). Every run gets a fresh store, WASI context and
instance, dropped afterwards: nothing a guest does survives into the next run except what it
wrote to a writable mount. Wall-clock limits (the epoch ticker, deadline-aware WASI sleeping)
are in :mod:`.clock`; the refusal to create links in :mod:`.links`.

A run returns only once wasmtime has let go of its output callbacks (:class:`_Sink`): wasmtime
calls them, and their finaliser, on its tokio worker threads, and a foreign thread that enters
Python while the interpreter is exiting aborts the process (docs/sandbox.md, "Process exit").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import wasmtime

from nanocrab.sandbox import clock, links
from nanocrab.sandbox.cache import Interpreter, find_interpreter, load_module, new_engine
from nanocrab.sandbox.channel import ResultChannel
from nanocrab.sandbox.limits import (
    WASM_PAGE,
    Limits,
    Mount,
    Outcome,
    SandboxError,
    SandboxResult,
)

STDLIB_GUEST = "/usr/local/lib"
WORKER_STACK_BYTES = 16 * 2**20  # virtual; see Sandbox.run
_STACK_SIZE_LOCK = threading.Lock()
_TAIL_BYTES = 1024  # of each stream, kept past the cap to classify how the run ended
_MEMORY_ERROR = re.compile(r"^MemoryError\b")
RELEASE_WAIT_S = 5.0  # for wasmtime to drop a finished run's output callbacks; normally < 10 ms

log = logging.getLogger(__name__)


# --- output capture -----------------------------------------------------------------------------


class _Capture:
    """A WASI output stream: keeps the first ``cap`` bytes and the last :data:`_TAIL_BYTES`,
    counts and drops the rest, so a guest printing gigabytes costs the host nothing but time.
    (A file per stream, read back capped, would still let the file grow on disk — ~150 MB/s
    here — for as long as fuel and the deadline allow.)"""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = b""
        self.total = 0

    def __call__(self, data: bytes) -> int:
        if len(self.head) < self.cap:
            self.head += data[: self.cap - len(self.head)]
        self.tail = (self.tail + data)[-_TAIL_BYTES:]
        self.total += len(data)
        return len(data)

    @property
    def text(self) -> str:
        return self.head.decode("utf-8", errors="replace")

    @property
    def truncated(self) -> bool:
        return self.total > self.cap


class _Sink:
    """What wasmtime-py holds for one output stream of one run, and nothing else does: its
    ``released`` event is set when wasmtime drops it (wasmtime-py frees the handle in the
    stream's finaliser, and with it the last reference). Until then a wasmtime thread may
    still call into Python for this run."""

    __slots__ = ("__weakref__", "capture")

    def __init__(self, capture: Callable[[bytes], int], released: threading.Event) -> None:
        self.capture = capture
        weakref.finalize(self, released.set)

    def __call__(self, data: bytes) -> int:
        return self.capture(data)


# --- the sandbox --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Compiled:
    engine: wasmtime.Engine
    pre: wasmtime.InstancePre
    min_memory: int  # the interpreter's initial linear memory; a smaller limit cannot start


class Sandbox:
    """Runs Python code in CPython-for-WASI under ``limits`` (overridable per run).

    Construction is cheap; the engine and compiled interpreter are loaded by :meth:`warm`,
    explicitly or on the first run. Runs execute in this sandbox's own thread pool (one
    thread per concurrent run, as many as CPUs), so many may run at once. Cancelling the
    awaiting task does not stop a run early; its limits do.
    """

    def __init__(self, cache_dir: Path, *, limits: Limits = Limits()) -> None:
        self.cache_dir = Path(cache_dir)
        self.limits = limits
        self.cache_hit: bool | None = None  # after warm(): loaded from the cache, not compiled
        self._interpreter: Interpreter | None = None
        self._compiled: dict[int, _Compiled] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(
            max_workers=max(4, os.cpu_count() or 1), thread_name_prefix="nanocrab-sandbox"
        )

    def warm(self) -> float:
        """Load the engine and compiled interpreter (from the cache, or compile and cache it);
        returns the seconds it took (about 0 when already warm). See :attr:`cache_hit`."""
        started = time.perf_counter()
        self._compiled_for(self.limits.stack_bytes)
        return time.perf_counter() - started

    async def run(
        self,
        code: str,
        *,
        mounts: Sequence[Mount] = (),
        limits: Limits | None = None,
        stdin: bytes = b"",
        argv: Sequence[str] = (),
        channel: ResultChannel | None = None,
    ) -> SandboxResult:
        """Run ``python -c code *argv`` and report how it ended; never raises for anything
        the guest does. The standard library is read-only at /usr/local/lib; each mount is
        at its guest path; the working directory is ``/`` (``PWD`` names the first mount).
        ``channel``: stdout passes through it, which keeps result frames out of ``stdout``
        (:mod:`.channel`). :class:`SandboxError` for an unusable mount or a missing
        interpreter."""
        limits = limits or self.limits
        hosts = _check_mounts(mounts)
        if any("\0" in s for s in (code, *argv)):
            raise SandboxError("code and argv must not contain NUL characters")
        loop = asyncio.get_running_loop()
        call = functools.partial(
            self._run_sync, code, mounts, hosts, limits, stdin, tuple(argv), channel
        )
        # WebAssembly runs on the worker thread's own stack: make sure it has room for
        # stack_bytes plus the host's frames, whatever the platform's default (musl: 128 KiB).
        with _STACK_SIZE_LOCK:
            previous = _set_thread_stack_size(WORKER_STACK_BYTES)
            try:
                future = loop.run_in_executor(self._pool, call)
            finally:
                _set_thread_stack_size(previous)
        return await future

    def _compiled_for(self, stack_bytes: int) -> _Compiled:
        with self._lock:
            compiled = self._compiled.get(stack_bytes)
            if compiled is None:
                if self._interpreter is None:
                    self._interpreter = find_interpreter()
                engine = new_engine(stack_bytes)
                module, hit = load_module(engine, self._interpreter.wasm, self.cache_dir)
                if stack_bytes == self.limits.stack_bytes:
                    self.cache_hit = hit
                linker = wasmtime.Linker(engine)
                linker.define_wasi()
                clock.install(linker)
                links.install(linker)
                memory = next(e.type for e in module.exports if e.name == "memory")
                assert isinstance(memory, wasmtime.MemoryType)
                pages = memory.limits.min
                compiled = _Compiled(engine, linker.instantiate_pre(module), pages * WASM_PAGE)
                self._compiled[stack_bytes] = compiled
            return compiled

    def _run_sync(
        self,
        code: str,
        mounts: Sequence[Mount],
        hosts: Sequence[str],
        limits: Limits,
        stdin: bytes,
        argv: tuple[str, ...],
        channel: ResultChannel | None,
    ) -> SandboxResult:
        compiled = self._compiled_for(limits.stack_bytes)
        out, err = _Capture(limits.output_bytes), _Capture(limits.output_bytes)
        stdout: Callable[[bytes], int] = out
        if channel is not None:
            channel.attach(out)
            stdout = channel
        released = (threading.Event(), threading.Event())  # stdout's and stderr's _Sink
        with _stdin_file(stdin) as stdin_path:
            try:
                wasi = self._wasi(code, argv, mounts, hosts, stdin_path, stdout, err, released)
            except wasmtime.WasmtimeError as exc:
                raise SandboxError(f"could not set up the sandbox's WASI context: {exc}") from exc
            store = wasmtime.Store(compiled.engine)
            store.set_limits(memory_size=limits.memory_bytes)
            store.set_fuel(limits.fuel)
            store.set_wasi(wasi)
            started = time.perf_counter()
            store.set_epoch_deadline(limits.deadline_ticks)
            with clock.TICKER.running(compiled.engine), clock.deadline(limits.timeout_s):
                end = _execute(compiled.pre, store)
            duration_ms = (time.perf_counter() - started) * 1000
            fuel_used = limits.fuel - store.get_fuel()
            del store  # the instance, its memory and WASI context go with it
            _await_release(released)
        if channel is not None:
            channel.close()
        outcome, detail = _classify(end, err, limits, compiled.min_memory)
        return SandboxResult(
            outcome=outcome,
            exit_code=end.exit_code,
            stdout=out.text,
            stderr=err.text,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            duration_ms=duration_ms,
            peak_memory_bytes=end.peak,
            fuel_used=fuel_used,
            detail=detail,
        )

    def _wasi(
        self,
        code: str,
        argv: tuple[str, ...],
        mounts: Sequence[Mount],
        hosts: Sequence[str],
        stdin_path: str | None,
        out: Callable[[bytes], int],
        err: _Capture,
        released: tuple[threading.Event, threading.Event],
    ) -> wasmtime.WasiConfig:
        """The guest's whole world: argv, a fixed environment, the standard library and the
        mounts (nothing else of the host's file system), captured stdout and stderr (each
        ``released`` event is set when wasmtime drops that stream's callback)."""
        assert self._interpreter is not None
        wasi = wasmtime.WasiConfig()
        wasi.argv = ["python", "-c", code, *argv]
        env = [("PYTHONHOME", "/usr/local"), ("PYTHONDONTWRITEBYTECODE", "1"), ("PYTHONUTF8", "1")]
        wasi.env = [*env, *([("PWD", mounts[0].guest)] if mounts else [])]
        wasi.preopen_dir(str(self._interpreter.stdlib), STDLIB_GUEST, False)
        for mount, host in zip(mounts, hosts, strict=True):
            wasi.preopen_dir(host, mount.guest, mount.writable)
        wasi.stdout_custom = _Sink(out, released[0])
        wasi.stderr_custom = _Sink(err, released[1])
        if stdin_path:
            wasi.stdin_file = stdin_path
        return wasi


def _await_release(released: tuple[threading.Event, ...]) -> None:
    """Wait until wasmtime has dropped the run's output callbacks.

    wasmtime's WASI writes a custom output stream from a tokio task (the default adapter for
    ``wasi_config_set_stdout_custom``), so the callbacks and the stream's finaliser run on a
    ``tokio-rt-worker`` thread, and the finaliser only once that task has been torn down —
    often a few milliseconds after the store was dropped. A run that returned before then let
    a process exit while the worker was still due to enter Python; CPython ends a foreign
    thread that asks for the GIL during finalisation with ``pthread_exit``, whose forced
    unwind through Rust's non-unwinding frames aborts the process ("panic in a function that
    cannot unwind", SIGABRT). Waiting here makes "the run returned" mean "wasmtime will not
    call into Python for it again"."""
    deadline = time.monotonic() + RELEASE_WAIT_S
    for event in released:
        if not event.wait(max(0.0, deadline - time.monotonic())):
            log.warning(
                "wasmtime kept a sandbox run's output stream for over %g s; exiting the process "
                "now could abort it",
                RELEASE_WAIT_S,
            )
            return


def _set_thread_stack_size(size: int) -> int:
    """The previous size; the platform default (0) kept where it cannot be changed."""
    try:
        return threading.stack_size(size)
    except (RuntimeError, ValueError):
        return 0


def _check_mounts(mounts: Sequence[Mount]) -> list[str]:
    guests = [m.guest for m in mounts]
    if len(set(guests)) != len(guests):
        raise SandboxError(f"two mounts share a guest path: {guests}")
    hosts = []
    for mount in mounts:
        host = os.path.realpath(mount.host)
        if not os.path.isdir(host):
            raise SandboxError(f"mount {mount.guest}: {mount.host} is not a directory")
        hosts.append(host)
    return hosts


@contextmanager
def _stdin_file(data: bytes) -> Iterator[str | None]:
    if not data:
        yield None  # wasmtime's default stdin reads as empty
        return
    fd, path = tempfile.mkstemp(prefix="nanocrab-stdin-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield path
    finally:
        os.unlink(path)


@dataclass(frozen=True)
class _Ending:
    """How ``_start`` ended, copied out of wasmtime's exception so that none outlives the run."""

    exit_code: int | None
    trap: wasmtime.TrapCode | None
    message: str
    peak: int
    started: bool = True  # False: instantiation failed


def _execute(pre: wasmtime.InstancePre, store: wasmtime.Store) -> _Ending:
    """Instantiate and run ``_start``.

    wasmtime-py's traps sit in a reference cycle (the exception is a local of a frame in its own
    traceback) that keeps the store — its linear memory, its open files — alive until the
    garbage collector happens to run; the leaked WASI streams are then finalised on a wasmtime
    thread at interpreter exit, which panics. Dropping each traceback here breaks the cycle.
    """
    try:
        instance = pre.instantiate(store)
    except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
        exc.__traceback__ = None
        return _Ending(None, None, f"could not instantiate the interpreter: {exc}", 0, False)
    exports = instance.exports(store)
    memory, start = exports["memory"], exports["_start"]
    assert isinstance(memory, wasmtime.Memory) and isinstance(start, wasmtime.Func)
    exit_code: int | None = None
    trap: wasmtime.TrapCode | None = None
    message = ""
    try:
        start(store)
        exit_code = 0
    except wasmtime.ExitTrap as exc:
        exc.__traceback__ = None
        exit_code = exc.code
    except wasmtime.Trap as exc:
        exc.__traceback__ = None
        trap, message = exc.trap_code, str(exc)
    except wasmtime.WasmtimeError as exc:
        exc.__traceback__ = None
        message = str(exc)
    return _Ending(exit_code, trap, message, memory.data_len(store))


_TRAP_OUTCOMES: dict[wasmtime.TrapCode, Outcome] = {
    wasmtime.TrapCode.OUT_OF_FUEL: "out_of_fuel",
    wasmtime.TrapCode.INTERRUPT: "timeout",
    wasmtime.TrapCode.STACK_OVERFLOW: "stack",
}
_FAULT_ADDRESS = re.compile(r"memory fault at wasm address 0x([0-9a-f]+)")


def _classify(end: _Ending, err: _Capture, limits: Limits, min_memory: int) -> tuple[Outcome, str]:
    """The outcome and a one-line description.

    - A ``MemoryError`` is recognised by the last line of stderr (a guest could print that
      line itself; it would only mislabel its own failure).
    - CPython's C stack lives at the bottom of linear memory (512 KiB, ``--stack-first``), so
      overflowing it wraps the stack pointer below address 0: an out-of-bounds access at an
      address past 4 GiB is a stack overflow. Which of the two stacks overflows first depends
      on ``stack_bytes``.
    - An abort (``unreachable``) with memory within 1 MiB of the limit is ``memory``: that is
      how CPython dies when an allocation it cannot survive fails.
    """
    if end.exit_code == 0:
        return "ok", "exited with status 0"
    if not end.started:
        if limits.memory_bytes < min_memory:
            return "memory", f"the interpreter needs {min_memory:,} bytes of memory to start"
        return "error", end.message
    if end.exit_code is not None:
        last = next((line for line in reversed(err.tail.splitlines()) if line.strip()), b"")
        if _MEMORY_ERROR.match(last.decode("utf-8", errors="replace")):
            return "memory", f"MemoryError: the {limits.memory_bytes:,}-byte memory limit was hit"
        return "exit_code", f"exited with status {end.exit_code}"
    outcome = _TRAP_OUTCOMES.get(end.trap) if end.trap else None
    if outcome == "out_of_fuel":
        return outcome, f"stopped: used all {limits.fuel:,} fuel"
    if outcome == "timeout":
        return outcome, f"stopped: ran past the {limits.timeout_s:g} s deadline"
    if outcome == "stack":
        return outcome, f"stopped: overflowed the {limits.stack_bytes:,}-byte WebAssembly stack"
    fault = _FAULT_ADDRESS.search(end.message)
    if end.trap == wasmtime.TrapCode.MEMORY_OUT_OF_BOUNDS and fault and int(fault[1], 16) >> 32:
        return "stack", "stopped: overflowed the interpreter's C stack (in linear memory)"
    if end.trap == wasmtime.TrapCode.UNREACHABLE and end.peak >= limits.memory_bytes - 2**20:
        return "memory", f"aborted at the {limits.memory_bytes:,}-byte memory limit"
    first_line = end.message.strip().split("\n", 1)[0]
    return "error", first_line if end.trap is None else f"trapped ({end.trap.name}): {first_line}"
