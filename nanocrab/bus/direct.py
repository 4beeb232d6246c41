"""Batched direct reads: every message of a subject filter after a sequence, in a round trip.

Handlers that keep per-run state in memory use this to fill the gap between what they have folded
and the event in hand (``$JS.API.DIRECT.GET`` with ``next_by_subj`` and ``batch``, nats-server
2.11+): far cheaper than an ordered consumer for the handful of events a gap usually holds.

The messages come back raw, with the subject each was stored on; a reader turns them into events
with ``EventLog.decode(raw.data, subject=raw.subject)``, which refuses an event stored on another
subject than its own (``bus/placement.py``).
"""

from __future__ import annotations

import asyncio
import itertools

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from nanocrab.bus.acks import send_acks_first
from nanocrab.bus.errors import BusError
from nanocrab.bus.log import RawMessage

_encoder = msgspec.json.Encoder()


class DirectReader:
    """One wildcard inbox for all batched direct gets on a connection."""

    def __init__(
        self, nc: NATS, stream: str, *, timeout_s: float = 5.0, leader_only: bool = False
    ) -> None:
        self.nc = nc
        self.stream = stream
        self.timeout_s = timeout_s
        self.leader_only = leader_only
        """Read through the stream leader (a replicated stream: replicas may lag)."""
        self.prefix = nc.new_inbox()
        self._ids = itertools.count(1)
        self._queues: dict[str, asyncio.Queue[Msg]] = {}
        self._started = False

    async def _start(self) -> None:
        if not self._started:
            self._started = True  # before the await: two first reads must not subscribe twice
            try:
                await self.nc.subscribe(f"{self.prefix}.*", cb=self._on_msg)
            except BaseException:
                self._started = False
                raise

    async def _on_msg(self, msg: Msg) -> None:
        queue = self._queues.get(msg.subject.rpartition(".")[2])
        if queue is not None:
            queue.put_nowait(msg)

    async def after(
        self, scope: str, after_seq: int, *, up_to: int | None = None, batch: int = 256
    ) -> list[RawMessage]:
        """Messages on ``scope`` with ``after_seq < seq`` (``<= up_to`` when given), in order."""
        await self._start()
        out: list[RawMessage] = []
        seq = after_seq + 1
        while True:
            page, pending = await self._page(scope, seq, batch)
            for m in page:
                if up_to is not None and m.seq > up_to:
                    return out
                out.append(m)
            if not page or pending == 0:
                return out
            seq = page[-1].seq + 1

    async def _page(self, scope: str, seq: int, batch: int) -> tuple[list[RawMessage], int]:
        if self.leader_only:
            return await self._leader_page(scope, seq, batch)
        token = str(next(self._ids))
        queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._queues[token] = queue
        page: list[RawMessage] = []
        try:
            request = {"seq": seq, "next_by_subj": scope, "batch": batch}
            await send_acks_first(self.nc)
            await self.nc.publish(
                f"$JS.API.DIRECT.GET.{self.stream}",
                _encoder.encode(request),
                reply=f"{self.prefix}.{token}",
            )
            while True:
                msg = await asyncio.wait_for(queue.get(), self.timeout_s)
                headers = msg.headers or {}
                status = headers.get("Status")
                if status == "404":
                    return page, 0
                if status == "204":
                    return page, int(headers.get("Nats-Num-Pending", "0") or 0)
                if status:
                    raise BusError(f"direct get on {self.stream} failed: {status} {headers}")
                page.append(
                    RawMessage(
                        seq=int(headers["Nats-Sequence"]),
                        subject=headers.get("Nats-Subject", ""),
                        data=msg.data,
                        headers=dict(headers),
                    )
                )
        except TimeoutError as exc:
            raise BusError(
                f"direct get on {self.stream} timed out after {self.timeout_s}s"
            ) from exc
        except nats.errors.Error as exc:
            raise BusError(f"direct get on {self.stream} failed: {exc!r}") from exc
        finally:
            del self._queues[token]

    async def _leader_page(self, scope: str, seq: int, batch: int) -> tuple[list[RawMessage], int]:
        """Up to ``batch`` messages from ``seq`` on, each asked of the stream leader."""
        js = self.nc.jetstream(timeout=self.timeout_s)
        page: list[RawMessage] = []
        try:
            while len(page) < batch:
                msg = await js.get_msg(self.stream, seq=seq, subject=scope, next=True)
                at = int(msg.seq or seq)
                page.append(
                    RawMessage(
                        seq=at,
                        subject=msg.subject or "",
                        data=msg.data or b"",
                        headers=dict(msg.headers or {}),
                    )
                )
                seq = at + 1
        except NotFoundError:
            return page, 0
        except (TimeoutError, nats.errors.Error) as exc:
            raise BusError(f"message get on {self.stream} failed: {exc!r}") from exc
        return page, 1
