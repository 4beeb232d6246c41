"""The bus's NATS client (``bus/connection.Client``): its header and protocol parsers give what
nats-py's do, and a connection made by ``connect`` uses them."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NatsClient
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from nanocrab.bus import EventLog
from nanocrab.bus.connection import Client
from nanocrab.bus.natsparse import FastParser

BLOCKS = [
    b"Nats-Msg-Id: 01M870KQSHGBS4VPAQ9K9YZV25\r\ntraceparent: 00-4bf9-00f0-01\r\n\r\n",
    b"Nats-Stream: LOG\r\nNats-Subject: nc.default.run.X.task.submitted\r\n"
    b"Nats-Sequence: 42\r\nNats-Time-Stamp: 2026-11-24T15:00:00.1Z\r\nNats-Num-Pending: 3\r\n\r\n",
    b"Name:Value\r\nTabbed:\tvalue\t\r\n  Padded  :  both sides  \r\n\r\n",
    b"No Colon Here\r\n: no name\r\nIn Side: whitespace in the name\r\nok: 1\r\n\r\n",
    b"Multi: a: b: c\r\nEmpty:\r\nDup: 1\r\nDup: 2\r\n\r\n",
    "Utf8: caf\u00e9 \u2713\r\n".encode() + b"Broken: \xff\xfe\r\n\xc3\xa9name: x\r\n\r\n",
    b"",
    b"\r\n\r\n",
]


@pytest.mark.parametrize("raw", BLOCKS)
def test_headers_parse_as_nats_py_parses_them(raw: bytes) -> None:
    assert Client._parse_header_lines(raw) == NatsClient._parse_header_lines(raw)


async def test_the_bus_connects_with_its_client(log: EventLog) -> None:
    assert isinstance(log.nc, Client)


class _Recorder:
    """What a parser hands the client, in order."""

    def __init__(self) -> None:
        self.calls: list[object] = []

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                           headers: bytes | None) -> None:  # fmt: skip
        self.calls.append(("msg", sid, bytes(subject), bytes(reply), data, headers))

    async def _process_ping(self) -> None:
        self.calls.append("ping")

    async def _process_pong(self) -> None:
        self.calls.append("pong")

    async def _process_err(self, err: str) -> None:
        self.calls.append(("err", err))

    async def _process_info(self, info: object) -> None:
        self.calls.append(("info", info))


def _hmsg(subject: bytes, sid: int, reply: bytes, headers: bytes, data: bytes) -> bytes:
    size = len(headers) + len(data)
    reply_part = reply + b" " if reply else b""
    return b"HMSG %s %d %s%d %d\r\n%s%s\r\n" % (subject, sid, reply_part, len(headers), size,
                                               headers, data)  # fmt: skip


WIRE = b"".join([
    b'INFO {"server_id":"x","max_payload":1048576}\r\n',
    b"+OK\r\n",
    b"MSG a.b 1 5\r\nhello\r\n",
    b"MSG a.b 1 _INBOX.r 0\r\n\r\n",
    _hmsg(b"nc.default.run.R1.run.started", 7, b"$JS.ACK.LOG.c.1.9.9.1732460000000000000.0",
          b"NATS/1.0\r\nNats-Msg-Id: 01X\r\n\r\n", b'{"id":"01X"}'),
    b"PING\r\n",
    _hmsg(b"f.c", 3, b"", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""),
    b"MSG  spaced.out   2   _INBOX.q   3\r\nabc\r\n",  # runs of spaces, as the grammar allows
    b"PONG\r\n",
    b"MSG x 1 12\r\nline\r\nbreaks\r\n",  # a payload holding CRLF
    b"-ERR 'Stale Connection'\r\n",
    _hmsg(b"last", 4, b"r", b"NATS/1.0\r\n\r\n", b"x" * 5000),
])  # fmt: skip


async def _parse_all(parser_cls: type, chunks: list[bytes]) -> list[object]:
    rec = _Recorder()
    parser = parser_cls(rec)
    for chunk in chunks:
        await parser.parse(chunk)
    assert not parser.buf  # everything read
    return rec.calls


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 64, 1000, len(WIRE)])
async def test_the_fast_parser_hands_the_client_what_nats_py_does(size: int) -> None:
    chunks = [WIRE[i : i + size] for i in range(0, len(WIRE), size)]
    expected = await _parse_all(Parser, chunks)
    assert len([c for c in expected if isinstance(c, tuple) and c[0] == "msg"]) == 7
    assert await _parse_all(FastParser, chunks) == expected


@pytest.mark.parametrize("line", [b"MSG a.b x 5\r\nhello\r\n", b"MSG a.b 1\r\n",
                                  b"WHAT is this\r\n"])  # fmt: skip
async def test_the_fast_parser_refuses_what_nats_py_refuses(line: bytes) -> None:
    for parser_cls in (Parser, FastParser):
        with pytest.raises(ProtocolError):
            await _parse_all(parser_cls, [line])


async def test_the_bus_reads_with_the_fast_parser(log: EventLog) -> None:
    assert isinstance(log.nc._ps, FastParser)


async def test_the_fast_parser_drops_what_it_held_when_the_client_resets_it() -> None:
    """A reconnect resets the parser while a message is processed: the rest of the old
    connection's bytes must not be handed to the client (nats-py's parser stops the same way)."""

    class Resetting(_Recorder):
        parser: Parser

        async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes,
                               headers: bytes | None) -> None:  # fmt: skip
            await super()._process_msg(sid, subject, reply, data, headers)
            self.parser.reset()

    for parser_cls in (Parser, FastParser):
        rec = Resetting()
        rec.parser = parser_cls(rec)
        await rec.parser.parse(b"MSG a 1 1\r\nx\r\nMSG b 1 1\r\ny\r\nPING\r\n")
        assert rec.calls == [("msg", 1, b"a", b"", b"x", None)], parser_cls
