"""Wall-clock limits for sandbox runs: the epoch ticker and deadline-aware WASI clock imports.

Epoch interruption stops WebAssembly code, not a host call the guest is blocked in, so the
deadline needs both halves:

- :data:`TICKER`, one daemon thread per process, advances the epoch of every engine with a run
  in flight every :data:`TICK_S` (a store's deadline is ``Limits.deadline_ticks`` of these);
- :func:`install` shadows the WASI ``poll_oneoff`` and ``clock_time_get`` imports, so a guest
  ``time.sleep(3600)`` (or ``select`` with a timeout) sleeps only until the run's deadline and
  then wakes into an expired epoch. Everything else in WASI stays wasmtime's.

The imports find the run through a thread-local set by :func:`deadline`: a run executes
entirely on one worker thread, and wasmtime calls host functions on the calling thread.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import wasmtime

TICK_S = 0.01  # one epoch tick; Limits.deadline_ticks counts these


class Ticker:
    """One daemon thread per process that advances the epoch of every engine with a run in
    flight, once per :data:`TICK_S` (catching up if it was late, so deadlines do not drift).
    Idle — no runs — it waits without waking."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[int, tuple[wasmtime.Engine, int]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def running(self, engine: wasmtime.Engine) -> Iterator[None]:
        with self._lock:
            _, count = self._active.get(id(engine), (engine, 0))
            self._active[id(engine)] = (engine, count + 1)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="nanocrab-sandbox-epoch", daemon=True
                )
                self._thread.start()
            self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                _, count = self._active[id(engine)]
                if count == 1:
                    del self._active[id(engine)]
                else:
                    self._active[id(engine)] = (engine, count - 1)

    def _loop(self) -> None:
        next_tick = time.monotonic() + TICK_S
        while True:
            with self._lock:
                engines = [engine for engine, _ in self._active.values()]
                if not engines:
                    self._wake.clear()
            if not engines:
                self._wake.wait()
                next_tick = time.monotonic() + TICK_S
                continue
            time.sleep(max(0.0, next_tick - time.monotonic()))
            now = time.monotonic()
            ticks = 0
            while next_tick <= now:
                next_tick += TICK_S
                ticks += 1
            for engine in engines:
                for _ in range(ticks):
                    engine.increment_epoch()


TICKER = Ticker()


_WASI = "wasi_snapshot_preview1"
_EFAULT, _EINVAL = 21, 28
_SUBSCRIPTION, _EVENT = 48, struct.Struct("<QHB5xQH6x")  # wasi preview1 layouts
_I32 = wasmtime.ValType.i32()
_U32 = 0xFFFF_FFFF


class _RunState(threading.local):
    clock: tuple[int, int]  # per worker thread: (monotonic start ns, deadline ns)


_run_state = _RunState()


@contextmanager
def deadline(timeout_s: float) -> Iterator[None]:
    """Tell this thread's clock imports when the current run started and must stop."""
    start = time.monotonic_ns()
    # A little past the epoch deadline, so the guest wakes to an already-expired epoch.
    _run_state.clock = (start, start + int((timeout_s + 2 * TICK_S) * 1e9))
    try:
        yield
    finally:
        del _run_state.clock


def _now(clock_id: int) -> int | None:
    """Guest time in ns: realtime is the host's; monotonic and the CPU-time clocks count from
    the start of the run (the guest has one thread, so its CPU time is its wall time)."""
    if clock_id == 0:
        return time.time_ns()
    if clock_id in (1, 2, 3):
        return time.monotonic_ns() - _run_state.clock[0]
    return None


def _clock_time_get(caller: wasmtime.Caller, clock_id: int, _precision: int, out: int) -> int:
    now = _now(clock_id)
    if now is None:
        return _EINVAL
    return _write(caller, out, struct.pack("<Q", now))


def _poll_oneoff(caller: wasmtime.Caller, subs: int, events: int, count: int, nout: int) -> int:
    """WASI ``poll_oneoff`` for a guest whose only descriptors are regular files and stdio:
    descriptor subscriptions are ready at once; otherwise sleep until the earliest clock
    subscription is due, but never past the run's deadline."""
    memory = caller["memory"]
    assert isinstance(memory, wasmtime.Memory)
    subs, events, nout = subs & _U32, events & _U32, nout & _U32  # i32 arrives signed
    if count <= 0:
        return _EINVAL
    raw = memory.read(caller, subs, subs + count * _SUBSCRIPTION)
    if len(raw) != count * _SUBSCRIPTION:
        return _EFAULT
    ready: list[tuple[int, int, int]] = []  # (userdata, errno, event type)
    clocks: list[tuple[int, int]] = []  # (ns until due, userdata)
    for base in range(0, len(raw), _SUBSCRIPTION):
        userdata, tag = struct.unpack_from("<QB", raw, base)
        if tag in (1, 2):  # fd_read, fd_write
            ready.append((userdata, 0, tag))
        elif tag == 0:
            (clock_id,) = struct.unpack_from("<I", raw, base + 16)
            (timeout,) = struct.unpack_from("<Q", raw, base + 24)
            (flags,) = struct.unpack_from("<H", raw, base + 40)
            now = _now(clock_id)
            if now is None:
                ready.append((userdata, _EINVAL, 0))
            else:
                clocks.append((max(0, timeout - now if flags & 1 else timeout), userdata))
        else:
            return _EINVAL
    if not ready and clocks:
        due = min(wait for wait, _ in clocks)
        allowed = max(0, _run_state.clock[1] - time.monotonic_ns())
        time.sleep(min(due, allowed) / 1e9)
        ready = [(userdata, 0, 0) for wait, userdata in clocks if wait == due]
    payload = b"".join(_EVENT.pack(userdata, errno, kind, 0, 0) for userdata, errno, kind in ready)
    return _write(caller, events, payload) or _write(caller, nout, struct.pack("<I", len(ready)))


def _write(caller: wasmtime.Caller, address: int, data: bytes) -> int:
    memory = caller["memory"]
    assert isinstance(memory, wasmtime.Memory)
    try:
        memory.write(caller, data, address & _U32)
    except IndexError:
        return _EFAULT
    return 0


def install(linker: wasmtime.Linker) -> None:
    """Shadow wasmtime's clock and poll imports with the deadline-aware ones above."""
    linker.allow_shadowing = True
    linker.define_func(
        _WASI, "clock_time_get", wasmtime.FuncType([_I32, wasmtime.ValType.i64(), _I32], [_I32]),
        _clock_time_get, access_caller=True,
    )  # fmt: skip
    linker.define_func(
        _WASI, "poll_oneoff", wasmtime.FuncType([_I32] * 4, [_I32]), _poll_oneoff,
        access_caller=True,
    )  # fmt: skip
