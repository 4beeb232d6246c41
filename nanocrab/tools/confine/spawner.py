"""The runtime's side of the spawner process (:mod:`nanocrab.tools.confine.zygote`).

Forking the runtime itself for every confined command would cost a page-table copy of
everything it has loaded (7 ms at 90 MB, 40 ms at 400 MB here, measured: docs/security.md), and
``preexec_fn`` rules out ``vfork``. So one small spawner process per runtime process, started
on first use, forks them instead. :func:`spawn` hands it a request and the command's
descriptors and returns a :class:`ConfinedChild`, whose exit status arrives on a pipe.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

_ZYGOTE = Path(__file__).with_name("zygote.py")
_PYTHON = sys.executable  # the spawner needs only the standard library (3.9+)
_REPLY_BYTES = 65536
_LOST = -9  # the status of a command whose spawner died before reporting it: as if killed


class SpawnerError(Exception):
    """The spawner refused or failed a request; the message is the child's ``step: reason``."""


class ConfinedChild:
    """A command started by the spawner: ``pid``, ``returncode`` once it exited, and
    :meth:`wait`. Its process group is its own (it leads a new session).

    The spawner reaps the command and then writes its status to a pipe; ``returncode`` looks at
    that pipe each time it is read, so it is known as soon as the status is, and a caller never
    takes the pid of a reaped command for a live one for longer than that write takes.
    """

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self._returncode: int | None = None
        self._status_fd = status_fd
        os.set_blocking(status_fd, False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future[int] | None = None

    @property
    def returncode(self) -> int | None:
        if self._returncode is None:
            self._poll()
        return self._returncode

    async def wait(self) -> int:
        """The exit status (``-N``: killed by signal ``N``). Safe to call again and to cancel."""
        if self.returncode is not None:
            return self.returncode
        if self._done is None:
            self._loop = asyncio.get_running_loop()
            self._done = self._loop.create_future()
            self._loop.add_reader(self._status_fd, self._poll)
        return await asyncio.shield(self._done)

    def wait_blocking(self) -> int:
        """:meth:`wait` for a caller without an event loop (the availability probe)."""
        while (code := self.returncode) is None:
            select.select([self._status_fd], [], [])
        return code

    def _poll(self) -> None:
        if self._status_fd < 0:
            return
        try:
            data = os.read(self._status_fd, 4)
        except BlockingIOError:
            return
        if self._loop is not None:
            self._loop.remove_reader(self._status_fd)
        os.close(self._status_fd)
        self._status_fd = -1
        self._returncode = struct.unpack("=i", data)[0] if len(data) == 4 else _LOST
        if self._done is not None and not self._done.done():
            self._done.set_result(self._returncode)


class _Spawner:
    """The spawner process of this process (a fork of the runtime starts its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner = -1
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._proc = subprocess.Popen(
                [_PYTHON, "-I", "-S", str(_ZYGOTE), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env={}, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self._sock, self._owner = ours, os.getpid()
        return ours

    def stop(self) -> None:
        """End the spawner (it exits when its socket closes); running commands are not its."""
        if self._sock is not None and self._owner == os.getpid():
            self._sock.close()
            if self._proc is not None:
                try:
                    self._proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        self._sock = self._proc = None

    def request(self, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        data = json.dumps(req).encode()
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        with self._lock:
            if self._owner != os.getpid():
                self._sock = self._proc = None  # the parent's, inherited through fork
            for _attempt in range(2):
                sock = self._sock or self._start()
                try:
                    sock.sendmsg([data], rights)
                    reply = sock.recv(_REPLY_BYTES)
                except OSError:
                    reply = b""
                if reply:
                    return dict(json.loads(reply))
                self.stop()  # it died: start a new one, once
        raise SpawnerError("spawner: the sandbox's spawner process does not answer")


_SPAWNER = _Spawner()
atexit.register(_SPAWNER.stop)


def spawn(req: dict[str, Any], *, stdout: int, stderr: int, ruleset_fd: int) -> ConfinedChild:
    """Start a confined command as ``req`` describes (see the zygote module); ``stdout`` and
    ``stderr`` are write ends the caller keeps and closes. Raises :class:`SpawnerError` when
    the child could not confine itself or ``exec`` (nothing ran)."""
    status_r, status_w = os.pipe()
    try:
        reply = _SPAWNER.request(req, [stdout, stderr, status_w, ruleset_fd])
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    if "pid" not in reply:
        os.close(status_r)
        raise SpawnerError(str(reply.get("error", reply)))
    return ConfinedChild(int(reply["pid"]), status_r)
