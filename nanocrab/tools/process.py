"""Running a shell command on this host: streamed output, a deadline, a cancel signal, and a
process tree that never outlives the call.

The command runs as ``/bin/sh -c`` in a new session, so it leads its own process group. When it
times out or is cancelled, every process of the tree gets SIGTERM (the group, plus descendants
psutil finds that moved to another group), and SIGKILL after a grace period. Processes the
command left running in its group when it exited are stopped the same way: background jobs do
not survive the call.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import psutil

from nanocrab.tools.base import OutputSink

Stream = Literal["stdout", "stderr"]
_READ_CHUNK = 64 * 1024
_POLL_S = 0.01


class Child(Protocol):
    """A started command: its pid (it leads its own process group), its exit status once known
    (``-N``: killed by signal ``N``), and a ``wait`` that may be cancelled and called again."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


Spawn = Callable[..., Awaitable[Child]]
"""``spawn(argv, *, cwd, env, stdout, stderr) -> Child``: start ``argv`` in a new session with
stdin from ``/dev/null`` and the given write descriptors (the caller closes its copies).
Raises ``OSError`` when nothing could be started."""


async def spawn_local(
    argv: list[str], *, cwd: Path, env: Mapping[str, str] | None, stdout: int, stderr: int
) -> Child:
    """:data:`Spawn` with this process's ``fork``/``exec`` (``vfork`` where CPython can)."""
    return await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=cwd,
        env=None if env is None else dict(env), start_new_session=True,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProcessOutcome:
    """How a command ended.

    ``exit_code`` is ``None`` when the call killed the command (timeout or abort); a negative
    value ``-N`` means the command died of signal ``N`` on its own. ``output`` is stdout and
    stderr interleaved in arrival order; when it grew beyond the backend's memory cap, only its
    last bytes are kept and ``dropped_bytes`` counts what was discarded from the front.
    """

    exit_code: int | None
    timed_out: bool
    aborted: bool
    duration_ms: float
    output: bytes
    dropped_bytes: int = 0


async def run_local_process(
    command: str,
    *,
    cwd: Path,
    timeout_s: float,
    cancel: asyncio.Event,
    on_output: OutputSink,
    env: dict[str, str] | None = None,
    spawn: Spawn = spawn_local,
    kill_grace_s: float = 2.0,
    drain_s: float = 1.0,
    max_output_bytes: int = 64 * 1024 * 1024,
) -> ProcessOutcome:
    """Run ``command`` with ``/bin/sh -c`` in ``cwd`` and wait for it, at most ``timeout_s``.

    Output chunks go to ``on_output`` as they arrive (decoded as UTF-8, split only on character
    boundaries). If ``cancel`` is set (also before the start) the command is aborted. ``env``
    replaces the environment; ``None`` inherits this process's. ``spawn`` starts the shell (the
    sandbox passes its own); what it raises when nothing could start propagates. After the
    command ends, output still arriving is read for at most ``drain_s``. Raises ``OSError`` when
    the shell cannot be started (e.g. ``cwd`` is missing); an exception from ``on_output`` stops
    the command and propagates.
    """
    started = time.monotonic()
    if cancel.is_set():
        return ProcessOutcome(
            exit_code=None, timed_out=False, aborted=True, duration_ms=0.0, output=b""
        )
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = await spawn(["/bin/sh", "-c", command], cwd=cwd, env=env, stdout=out_w,
                           stderr=err_w)  # fmt: skip
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    pipes = _Pipes({out_r: "stdout", err_r: "stderr"}, max_output_bytes)
    pump = asyncio.create_task(pipes.pump(on_output))
    ending: Literal["exited", "timeout", "aborted"] = "aborted"
    try:
        ending = await wait_for_end(proc.wait(), cancel, pump, timeout_s)
    finally:
        await kill_tree(proc.pid, grace_s=kill_grace_s, leader_alive=proc.returncode is None)
        await proc.wait()
        try:
            await asyncio.wait_for(asyncio.shield(pump), drain_s)
        except TimeoutError:
            pipes.close()
            await pump
    return ProcessOutcome(
        exit_code=proc.returncode if ending == "exited" else None,
        timed_out=ending == "timeout",
        aborted=ending == "aborted",
        duration_ms=(time.monotonic() - started) * 1000,
        output=bytes(pipes.output),
        dropped_bytes=pipes.dropped,
    )


async def wait_for_end(
    ended: Coroutine[Any, Any, object],
    cancel: asyncio.Event,
    pump: asyncio.Task[None],
    timeout_s: float,
) -> Literal["exited", "timeout", "aborted"]:
    """How a command ended: ``ended`` returned (the process or the remote channel exited),
    ``timeout_s`` passed, or ``cancel`` was set. A failure of ``pump`` (the output reader) is
    raised; its normal end is not an end of the command."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    exited = asyncio.create_task(ended)
    cancelled = asyncio.create_task(cancel.wait())
    watched: set[asyncio.Future[Any]] = {exited, cancelled, pump}
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return "timeout"
            done, _ = await asyncio.wait(
                watched, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if exited in done:
                return "exited"
            if cancelled in done:
                return "aborted"
            if pump in done:
                watched.discard(pump)
                pump.result()
    finally:
        exited.cancel()
        cancelled.cancel()


class _Pipes:
    """Reads the child's stdout and stderr as data arrives and hands it on in arrival order."""

    def __init__(self, fds: dict[int, Stream], max_output_bytes: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._streams = fds
        self._open = set(fds)
        self._queue: asyncio.Queue[tuple[Stream, bytes] | None] = asyncio.Queue()
        self._max = max_output_bytes
        self.output = bytearray()
        self.dropped = 0
        for fd in fds:
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._readable, fd)

    def _readable(self, fd: int) -> None:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._queue.put_nowait((self._streams[fd], data))
        else:
            self._close(fd)

    def _close(self, fd: int) -> None:
        if fd not in self._open:
            return
        self._loop.remove_reader(fd)
        os.close(fd)
        self._open.discard(fd)
        if not self._open:
            self._queue.put_nowait(None)

    def close(self) -> None:
        """Stop reading (pipes some escaped process still holds open)."""
        for fd in list(self._open):
            self._close(fd)

    async def pump(self, on_output: OutputSink) -> None:
        """Collect and forward chunks until both pipes are closed; closes them on failure."""
        streams: tuple[Stream, ...] = ("stdout", "stderr")
        decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in streams}
        try:
            while (item := await self._queue.get()) is not None:
                stream, data = item
                self._keep(data)
                text = decoders[stream].decode(data)
                if text:
                    await on_output(stream, text)
            for stream, decoder in decoders.items():
                if rest := decoder.decode(b"", final=True):
                    await on_output(stream, rest)
        except BaseException:
            self.close()
            raise

    def _keep(self, data: bytes) -> None:
        self.output += data
        excess = len(self.output) - self._max
        if excess > 0:
            del self.output[:excess]
            self.dropped += excess


async def kill_tree(pid: int, *, grace_s: float, leader_alive: bool = True) -> None:
    """Stop the process ``pid``, its descendants and its process group (``pid`` leads it).

    SIGTERM first; whatever is still running after ``grace_s`` gets SIGKILL. Zombies count as
    gone. Returns at once when nothing of the tree is left. Pass ``leader_alive=False`` once
    ``pid`` has been reaped: its number may then belong to an unrelated process, so only the
    group's remaining members are stopped.
    """
    procs = _tree(pid, leader_alive=leader_alive)
    if not procs:
        return
    _signal(pid, procs, signal.SIGTERM)
    alive = await _wait_gone(procs, grace_s)
    if alive:
        _signal(pid, alive, signal.SIGKILL)
        await _wait_gone(alive, 1.0)


def _tree(pid: int, *, leader_alive: bool) -> list[psutil.Process]:
    """The live processes of the tree: ``pid``, its descendants, and its group's members."""
    found: dict[int, psutil.Process] = {}
    if leader_alive:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            found[pid] = root
            for child in root.children(recursive=True):
                found[child.pid] = child
    if _group_exists(pid):
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if proc.pid not in found and os.getpgid(proc.pid) == pid:
                    found[proc.pid] = proc
    return [p for p in found.values() if _running(p)]


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(pgid: int, procs: list[psutil.Process], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


async def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Poll until every process has exited or ``timeout_s`` passed; returns those still alive."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        await asyncio.sleep(_POLL_S)
        alive = [p for p in alive if _running(p)]
    return alive
