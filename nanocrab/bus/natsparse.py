"""nats-py's protocol parser with a fast path for message frames.

nats-py matches every control line against a chain of regular expressions, ``MSG`` first, so a
message with headers (``HMSG``: every stored event, every JetStream delivery) fails one pattern
before it matches the next, and its payload is copied twice. Message frames are nearly all a
busy client reads: this parser reads their control line with ``find``/``split`` and copies the
payload once; every other line (``PING``, ``+OK``, ``-ERR``, ``INFO``) and any frame it cannot
read goes to nats-py's own parser, which also raises its protocol errors. Same calls into the
client (``_process_msg(sid, subject, reply, payload, headers)``), same state on the parser
object, so nats-py's ``reset()`` on reconnect works unchanged (``tests/test_bus_connection.py``).

This module imports nats-py only: the catch-up reader process (``projections/_reader.py``)
loads it by path without importing the rest of nanocrab.
"""

from __future__ import annotations

from nats.protocol.parser import (
    AWAITING_CONTROL_LINE,
    AWAITING_MSG_PAYLOAD,
    CRLF_SIZE,
    MAX_CONTROL_LINE_SIZE,
    Parser,
)

_CRLF = b"\r\n"


class FastParser(Parser):
    async def parse(self, data: bytes = b"") -> None:
        self.buf.extend(data)
        nc = self.nc
        # ``self.buf`` read again after every await: a reconnect resets the parser (a new
        # buffer) while a message is being processed, and what the old one held is dropped
        while buf := self.buf:
            if self.state == AWAITING_CONTROL_LINE:
                end = buf.find(_CRLF)
                if end < 0:
                    return  # a control line split across reads: wait for the rest
                if self._message_line(buf, end):
                    continue
                line = bytes(buf[:end])
                if line in (b"PING", b"PONG", b"+OK"):  # keep-alives, between messages
                    del buf[: end + CRLF_SIZE]
                    if line == b"PING":
                        await nc._process_ping()
                    elif line == b"PONG":
                        await nc._process_pong()
                    continue
                await Parser.parse(self)  # anything else: nats-py's own reading
                if self.state == AWAITING_CONTROL_LINE:
                    return  # it took all it could
                continue
            needed = self.needed
            if len(buf) < needed + CRLF_SIZE:
                return
            header_size = self.header_needed
            with memoryview(buf) as view:
                if header_size:
                    headers: bytes | None = bytes(view[:header_size])
                    payload = bytes(view[header_size:needed])
                else:
                    headers, payload = None, bytes(view[:needed])
            del buf[: needed + CRLF_SIZE]
            self.header_needed = 0
            self.state = AWAITING_CONTROL_LINE
            arg = self.msg_arg
            await nc._process_msg(arg["sid"], arg["subject"], arg["reply"], payload, headers)

    def _message_line(self, buf: bytearray, end: int) -> bool:
        """Read the ``MSG``/``HMSG`` control line ending at ``end`` into the parser's state;
        ``False`` (``buf`` untouched) when the line at the start of ``buf`` is not one."""
        if end > MAX_CONTROL_LINE_SIZE:
            return False
        words = bytes(buf[:end]).split()
        try:
            if words[0] == b"HMSG" and len(words) in (5, 6):
                header_size, needed = int(words[-2]), int(words[-1])
                reply = words[3] if len(words) == 6 else b""
            elif words[0] == b"MSG" and len(words) in (4, 5):
                header_size, needed = 0, int(words[-1])
                reply = words[3] if len(words) == 5 else b""
            else:
                return False
            sid = int(words[2])
        except (IndexError, ValueError):
            return False  # nats-py's parser says what is wrong with it
        if not 0 <= header_size <= needed:
            return False
        arg = self.msg_arg
        arg["subject"], arg["sid"], arg["reply"] = words[1], sid, reply
        self.needed, self.header_needed = needed, header_size
        del buf[: end + CRLF_SIZE]
        self.state = AWAITING_MSG_PAYLOAD
        return True


__all__ = ["FastParser"]
