"""The result channel of a structured call: framed bytes on the guest's stdout, held in memory
up to ``Limits.result_bytes``, never written to disk.

The guest has no writable directory for its result (a writable one let a Safe call fill the
host's disk: nothing capped what it wrote there). Instead the wrapper (:mod:`.runner`) writes
one frame to file descriptor 1 after flushing the code's own output::

    marker  (NUL, "nanocrab-result-", a per-call random nonce, NUL)
    length  (16 lowercase hex digits: the payload's size in bytes)
    payload (UTF-8 JSON)

:class:`ResultChannel` sits between the guest's stdout and the run's output capture: bytes
outside a frame are the code's own output and pass through; a frame's payload is kept here.
A frame declaring more than the cap (counted over every frame of the run) is refused before
any of its payload is kept: the channel marks itself ``overflowed`` and fails that write and
every later one on stdout (``EIO`` in the guest), so the host never holds more than the cap.

The nonce keeps ordinary output from being mistaken for a frame; it is not a secret from the
code (which can read its request), and need not be: forging a frame only lets the code
misreport its own result, as it always could.
"""

from __future__ import annotations

import errno
import secrets
from collections.abc import Callable
from typing import Literal

MARKER_PREFIX = b"\x00nanocrab-result-"
LENGTH_DIGITS = 16
_EIO = -errno.EIO  # a custom output stream's return value that fails the guest's write

ChannelError = Literal["too_large", "malformed"]
"""What went wrong with the channel: ``too_large``, a frame (or frames) over the cap;
``malformed``, a frame whose length is not 16 hex digits."""


class ResultChannel:
    """Splits one run's stdout into the code's output (passed to ``out``) and result frames
    (the last complete one is :attr:`payload`). Fed by wasmtime's stdout callback, on its
    threads, one call at a time; read after the run has returned."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.marker = MARKER_PREFIX + secrets.token_hex(16).encode() + b"\x00"
        self.payload: bytes | None = None
        self.error: ChannelError | None = None
        self._out: Callable[[bytes], object] = _discard
        self._pending = b""  # the end of the last write, when it may begin a marker
        self._length: bytearray | None = None  # inside a frame's length digits
        self._body: bytearray | None = None  # inside a frame's payload
        self._need = 0  # payload bytes still to come
        self._declared = 0  # payload bytes declared by every frame so far

    def attach(self, out: Callable[[bytes], object]) -> None:
        """Where the code's own output goes (the run's stdout capture)."""
        self._out = out

    def __call__(self, data: bytes) -> int:
        if self.error == "too_large":
            return _EIO
        buf = self._pending + data if self._pending else data
        self._pending = b""
        pos = 0
        while pos < len(buf):
            if self._body is not None:
                take = buf[pos : pos + self._need]
                self._body += take
                self._need -= len(take)
                pos += len(take)
                if not self._need:
                    self.payload, self._body = bytes(self._body), None
            elif self._length is not None:
                take = buf[pos : pos + LENGTH_DIGITS - len(self._length)]
                self._length += take
                pos += len(take)
                if len(self._length) == LENGTH_DIGITS and not self._start_body():
                    return _EIO
            else:
                found = buf.find(self.marker, pos)
                if found < 0:
                    keep = _partial_marker(buf, pos, self.marker)
                    self._emit(buf[pos : len(buf) - keep])
                    self._pending = bytes(buf[len(buf) - keep :])
                    break
                self._emit(buf[pos:found])
                pos = found + len(self.marker)
                self._length = bytearray()
        return len(data)

    def _start_body(self) -> bool:
        """A frame's length has arrived: False (fail the write) when it passes the cap."""
        digits, self._length = bytes(self._length or b""), None
        if not all(c in b"0123456789abcdef" for c in digits):
            self.error = "malformed"
            return True
        size = int(digits, 16)
        self._declared += size
        if self._declared > self.cap:
            self.error, self.payload = "too_large", None
            return False
        if size:
            self._body, self._need = bytearray(), size
        else:
            self.payload = b""
        return True

    def close(self) -> None:
        """The run is over: output held back as a possible marker start is the code's."""
        pending, self._pending = self._pending, b""
        self._emit(pending)

    def _emit(self, data: bytes) -> None:
        if data:
            self._out(data)


def _partial_marker(buf: bytes, pos: int, marker: bytes) -> int:
    """How many bytes at the end of ``buf[pos:]`` could be the start of ``marker``."""
    start = max(pos, len(buf) - len(marker) + 1)
    at = buf.find(marker[:1], start)
    while at >= 0:
        if marker.startswith(buf[at:]):
            return len(buf) - at
        at = buf.find(marker[:1], at + 1)
    return 0


def _discard(_data: bytes) -> None:
    return None
