"""The bus's NATS client (``bus/connection.Client``): its header parser gives what nats-py's
does, and a connection made by ``connect`` uses it."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NatsClient

from nanocrab.bus import EventLog
from nanocrab.bus.connection import Client

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
