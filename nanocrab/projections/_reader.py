"""Reads a range of the log for a catch-up in a process of its own, writing it to stdout.

nats-py's delivery of an ordered consumer costs ~10-14 µs of CPU per message, as much as
decoding and inserting it: run in the projector's interpreter it halves a rebuild's rate.
This script does only that part, on another core, so the projector decodes and writes while it
reads (``Projector.catch_up``).

It runs as a plain script (``python _reader.py``), never imported through ``nanocrab``, so it
starts in a fraction of a second: it imports nats-py and msgspec only. Its request comes as one
JSON line on stdin (the nkey seed is a secret: never on the command line). Its answer on stdout
is a sequence of frames, each a 4-byte big-endian length and a msgpack list of
``[stream_seq, stored_ns, subject, data]``; an empty list ends the range. Anything going wrong
ends the process with a non-zero status and the reason on stderr.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import struct
import sys
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

_FRAME = struct.Struct(">I")
_STATUS_AT = len(b"NATS/1.0")


def _fast_parser() -> type:
    """``nanocrab/bus/natsparse.py``'s parser, loaded by path: importing ``nanocrab.bus`` would
    load the whole bus, and from this checkout rather than whichever nanocrab is installed."""
    path = Path(__file__).resolve().parent.parent / "bus" / "natsparse.py"
    spec = importlib.util.spec_from_file_location("_nanocrab_natsparse", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser: type = module.FastParser
    return parser


class _Client(Client):
    """nats-py's client without parsing the headers a stored event carries (``Nats-Msg-Id``,
    ``traceparent``): nothing here reads them, and parsing them was a quarter of this process's
    CPU per event. Headers with an inline status (``NATS/1.0 100 FlowControl Request``, idle
    heartbeats) are parsed as before: the ordered consumer's flow control needs them. Message
    frames are read by the bus's faster parser (``bus/natsparse.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self._ps = _fast_parser()(self)

    async def _process_headers(self, headers: bytes) -> dict[str, str] | None:
        if headers and headers[_STATUS_AT : _STATUS_AT + 1] != b" ":
            return None
        hdr: dict[str, str] | None = await super()._process_headers(headers)
        return hdr


def _position(reply: str) -> tuple[int, int, int]:
    """(stream seq, stored ns, pending) from ``$JS.ACK...`` (as ``bus.replay.position``)."""
    tokens = reply.split(".")
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[7]), int(tokens[8])
    if len(tokens) >= 11:
        return int(tokens[7]), int(tokens[9]), int(tokens[10])
    raise ValueError(f"not a JetStream delivery: {reply!r}")


async def _read(req: dict[str, Any]) -> None:
    out = sys.stdout.buffer
    encode = msgspec.msgpack.Encoder().encode
    batch_size = int(req["batch_size"])
    end = int(req["end_seq"])
    seed = req.get("seed")
    nc = _Client()
    await nc.connect(
        req["url"], name="nanocrab-reader", nkeys_seed_str=seed or None,
        max_reconnect_attempts=0, connect_timeout=5,
    )  # fmt: skip
    buf: list[tuple[int, int, str, bytes]] = []
    done = asyncio.Event()
    wake = asyncio.Event()
    drained = asyncio.Event()

    def write(frame: bytes) -> None:
        out.write(_FRAME.pack(len(frame)) + frame)
        out.flush()

    async def put(msg: Msg) -> None:
        if len(buf) >= 8 * batch_size:  # the projector is behind: let flow control hold the rest
            drained.clear()
            await drained.wait()
        seq, ns, pending = _position(msg.reply)
        buf.append((seq, ns, msg.subject, msg.data))
        if seq >= end or pending == 0:
            done.set()
            wake.set()
        elif len(buf) >= batch_size:
            wake.set()

    start = int(req["start_seq"])
    config = (
        ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
        if start > 1
        else ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    js = nc.jetstream()
    sub = await js.subscribe(
        req["filter"], stream=req["stream"], cb=put, ordered_consumer=True,
        idle_heartbeat=1.0, config=config, pending_msgs_limit=1_000_000,
        pending_bytes_limit=1024 * 1024 * 1024,
    )  # fmt: skip
    try:
        while True:
            try:
                await asyncio.wait_for(wake.wait(), float(req["stall_s"]))
            except TimeoutError:
                # nothing for a while: the rest of the range does not match the filter
                info = await sub.consumer_info()
                if not info.num_pending and not buf:
                    done.set()
            wake.clear()
            if buf:
                chunk, buf[:] = buf[:], []
                drained.set()
                await asyncio.to_thread(write, encode(chunk))
            if done.is_set() and not buf:
                break
        write(encode([]))
    finally:
        await nc.close()


def main() -> None:
    req = json.loads(sys.stdin.readline())
    try:
        asyncio.run(_read(req))
    except Exception as exc:  # reported to the projector through stderr and the exit status
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
