"""One remote command over an SSH exec channel, for :class:`~nanocrab.tools.ssh.SshOperations`:
the command line sent to sshd (:func:`wrapper`), the channel that collects its output, pid and
exit status (:class:`Channel`), and the wait for its end, time-out or cancellation
(:func:`wait_channel`)."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import shlex
import signal
from typing import Literal

import asyncssh

from nanocrab.tools.base import OutputSink
from nanocrab.tools.process import wait_for_end

PID_MARKER = b"nanocrab-pid "
Stream = Literal["stdout", "stderr"]


def wrapper(command: str, root: str, env: dict[str, str] | None) -> str:
    """The command line sent to sshd: a POSIX shell that reports its pid (the process group's
    id), runs ``command`` in ``root`` and stops what it left running in its group."""
    inner = f"/bin/sh -c {shlex.quote(command)} </dev/null"
    if env is not None:
        assigned = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        inner = f"env -i {assigned} {inner}"
    script = (
        f'printf "{PID_MARKER.decode()}%s\\n" "$$" >&2\n'
        f"cd -- {shlex.quote(root)} || exit 126\n"
        f"{inner}\n"
        "rc=$?\n"
        "trap '' TERM\n"
        "kill -TERM 0 2>/dev/null\n"
        'exit "$rc"\n'
    )
    return f"exec /bin/sh -c {shlex.quote(script)}"


class Channel(asyncssh.SSHClientSession[bytes]):
    """One command's channel: output in arrival order (stderr's pid marker taken out), the exit
    status, and the end of the channel."""

    def __init__(self, max_output_bytes: int) -> None:
        self._queue: asyncio.Queue[tuple[Stream, bytes] | None] = asyncio.Queue()
        self._max = max_output_bytes
        self._head = b""  # stderr before the marker line is complete
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.exited = asyncio.Event()
        self.closed = asyncio.Event()
        self.output = bytearray()
        self.dropped = 0

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        stream: Stream = "stderr" if datatype == asyncssh.EXTENDED_DATA_STDERR else "stdout"
        if stream == "stderr" and self.pid is None and self._head is not None:
            self._head += data
            line, sep, rest = self._head.partition(b"\n")
            if not sep:
                return
            self._head = b""
            if line.startswith(PID_MARKER):
                with contextlib.suppress(ValueError):
                    self.pid = int(line[len(PID_MARKER) :])
                data = rest
            else:
                data = line + sep + rest
        if data:
            self._queue.put_nowait((stream, data))

    def exit_status_received(self, status: int) -> None:
        self.exit_code = status
        self.exited.set()

    def exit_signal_received(
        self, signal_name: str, core_dumped: bool, msg: str, lang: str
    ) -> None:
        try:
            self.exit_code = -int(signal.Signals[f"SIG{signal_name}"])
        except KeyError:
            self.exit_code = 255
        self.exited.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.exited.is_set():
            self.exit_code = 255  # like ssh(1): the connection ended without an exit status
            self.exited.set()
        self.closed.set()
        self.finish()

    def finish(self) -> None:
        """No more output will be read (the channel closed, or was given up on)."""
        self._queue.put_nowait(None)

    async def pump(self, on_output: OutputSink) -> None:
        """Keep and forward chunks (decoded as UTF-8 on character boundaries) until the end."""
        streams: tuple[Stream, ...] = ("stdout", "stderr")
        decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in streams}
        while (item := await self._queue.get()) is not None:
            stream, data = item
            self._keep(data)
            if text := decoders[stream].decode(data):
                await on_output(stream, text)
        for stream, decoder in decoders.items():
            if rest := decoder.decode(b"", final=True):
                await on_output(stream, rest)

    def _keep(self, data: bytes) -> None:
        self.output += data
        excess = len(self.output) - self._max
        if excess > 0:
            del self.output[:excess]
            self.dropped += excess


async def wait_channel(
    channel: Channel, cancel: asyncio.Event, pump: asyncio.Task[None], timeout_s: float
) -> Literal["exited", "timeout", "aborted"]:
    """:func:`~nanocrab.tools.process.wait_for_end` of the channel's exit."""
    return await wait_for_end(channel.exited.wait(), cancel, pump, timeout_s)
