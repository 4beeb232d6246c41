"""Pull requests on a durable consumer kept outstanding from one fetch to the next (the
handler runtime's way of receiving its deliveries, ``bus/runtime.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from nanocrab.bus.acks import send_acks_first
from nanocrab.bus.errors import BusError
from nanocrab.bus.log import EventLog

CONNECTION_ERRORS = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoServersError,
    nats.errors.TimeoutError,
    nats.errors.SlowConsumerError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.APIError,
    BusError,
    OSError,
)
"""Errors that mean "the connection or server is not there right now": rebuild the
subscription."""
_encoder = msgspec.json.Encoder()


class Puller:
    """Pull requests on one durable consumer, kept outstanding from one fetch to the next.

    nats-py's ``fetch`` sends a ``no_wait`` probe and then a second, waiting request on every
    call, and forgets what it asked for: when a handler is idle that is two requests and a
    "no messages" reply per delivery. Here a request for ``batch`` messages (expiring after
    ``expires_s``) stays open until the server has delivered them or says it ended (a 408 when
    it expires, with how many it did not deliver); a fetch only asks for what is not asked for
    already, so a delivery usually costs no request at all: the ack is the only message sent.
    A request the server never answered (a restart) is forgotten a little after its expiry.
    """

    def __init__(self, log_: EventLog, durable: str) -> None:
        self.nc = log_.nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{log_.cfg.log_stream}.{durable}"
        self.inbox = log_.nc.new_inbox()
        self.msgs: deque[Msg] = deque()
        self.wanted = 0  # requested, not delivered yet (nor reported undelivered)
        self.expires_at = 0.0  # monotonic time by which every open request has expired
        self._waiter: asyncio.Future[None] | None = None
        self._stop_by: float | None = None  # stopping: the fetch waits no later than this
        self._sub: Subscription | None = None
        self._refused = False

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(self.inbox, cb=self._on_msg)

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        status = headers.get("Status") if headers else None
        if status is None:
            self.wanted = max(0, self.wanted - 1)
            self.msgs.append(msg)
        elif status == "100":
            return  # an idle heartbeat (none are asked for)
        else:  # 404, 408, 409: a request ended; what it did not deliver is no longer asked for
            pending = (headers or {}).get("Nats-Pending-Messages", "")
            self.wanted = max(0, self.wanted - int(pending)) if pending.isdigit() else 0
            self._refused = status == "409"
        self._wake()

    async def fetch(self, batch: int, expires_s: float) -> list[Msg]:
        """Up to ``batch`` messages: those delivered already, else the first to arrive within
        ``expires_s`` (and whatever came with it); ``[]`` when none did. After :meth:`stop`,
        only what arrives within its grace."""
        now = time.monotonic()
        await self.ask(batch, expires_s)
        deadline = now + expires_s + 0.1
        while not self.msgs:
            end = deadline if self._stop_by is None else min(deadline, self._stop_by)
            remaining = end - time.monotonic()
            if remaining <= 0:
                return []
            await self._wait(remaining)
            if not self.msgs and self.wanted == 0:
                if self._refused:  # e.g. too many waiting requests: not at once again
                    self._refused = False
                    await asyncio.sleep(0.1)
                return []  # the request ended empty; the caller asks again
        return self.ready(batch)

    async def _wait(self, seconds: float) -> None:
        """Until a message or a status arrives, :meth:`stop` is called, or ``seconds``.

        A bare future and a timer: a fetch waits once per delivery on an idle handler, and
        ``asyncio.wait_for`` on an ``Event`` made a task and a timer each time."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(seconds, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if self._waiter is waiter:
                self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter)

    def stop(self, grace_s: float) -> None:
        """Stop waiting: a fetch returns what it has, or what arrives within ``grace_s`` (a
        message already on its way is handled, not left to time out unacknowledged)."""
        if self._stop_by is None:
            self._stop_by = time.monotonic() + grace_s
        self._wake()

    async def ask(self, batch: int, expires_s: float) -> None:
        """Have about ``batch`` messages asked for or delivered: a request for what is missing
        once half of it is (refill, not top up), expiring after ``expires_s``."""
        now = time.monotonic()
        if now > self.expires_at + 1.0:
            self.wanted = 0  # every request has expired: nothing more will come of them
        missing = batch - self.wanted - len(self.msgs)
        if missing > 0 and self.wanted + len(self.msgs) <= batch // 2:
            request = {"batch": missing, "expires": int(expires_s * 1e9)}
            await send_acks_first(self.nc)
            await self.nc.publish(self.subject, _encoder.encode(request), reply=self.inbox)
            self.wanted += missing
            self.expires_at = now + expires_s

    def ready(self, batch: int) -> list[Msg]:
        """Up to ``batch`` of the messages delivered already, without waiting."""
        out: list[Msg] = []
        while self.msgs and len(out) < batch:
            out.append(self.msgs.popleft())
        return out

    async def close(self) -> None:
        """Unsubscribe; messages delivered and not taken go back to the server at once."""
        if self._sub is not None:
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self._sub.unsubscribe()
        while self.msgs:
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self.msgs.popleft().nak()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
