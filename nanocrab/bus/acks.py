"""Acknowledgements that ride with the connection's next message out.

A handler acknowledges a delivery once its reactions are stored (``bus/runtime.py``). Sent at
once, every ack is a socket write of its own — a third of the messages a run sends — because the
reactions' appends went out before it and the next ones come later. Here an ack waits, on its
connection, for that connection's next message (an append, a read, a pull request: the callers of
:func:`send_acks_first`) or for :data:`ACK_DELAY_S`, whichever comes first, and goes out in the
same write.

What a late ack costs: nothing while the process lives (the server redelivers only after
``ack_wait``, 30 s by default); after a crash, the deliveries acknowledged in the last
:data:`ACK_DELAY_S` come again, which a handler must survive anyway (a crash between the append
and the ack has always redelivered, and reactions deduplicate). A runtime that stops sends its
acks before it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

ACK_DELAY_S = 0.02
"""Longest an ack waits for company."""


class DeferredAcks:
    """The acks due on one connection."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.due: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def add(self, msg: Msg) -> None:
        """Acknowledge ``msg`` with the connection's next message, or within
        :data:`ACK_DELAY_S`."""
        if not msg.reply:
            return  # not a JetStream delivery: nothing to acknowledge
        msg._ackd = True  # what Msg.ack() records (a second ack would raise)
        self.due.append(msg.reply)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(ACK_DELAY_S, self._expired)

    def _expired(self) -> None:
        self._timer = None
        if self.due:
            task = asyncio.ensure_future(self.send())
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def send(self) -> None:
        """Publish the acks due (queued on the connection: a message published right after, with
        no await in between, leaves in the same write). A connection that is gone loses them:
        the server redelivers those messages, as after a crash."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due, self.due = self.due, []
        for reply in due:
            with contextlib.suppress(nats.errors.Error, OSError):
                await self.nc.publish(reply)


_DUE: weakref.WeakKeyDictionary[NATS, DeferredAcks] = weakref.WeakKeyDictionary()


def deferred_acks(nc: NATS) -> DeferredAcks:
    """The connection's :class:`DeferredAcks` (one per connection)."""
    acks = _DUE.get(nc)
    if acks is None:
        acks = _DUE[nc] = DeferredAcks(nc)
    return acks


async def send_acks_first(nc: NATS) -> None:
    """Queue the acks due on ``nc`` ahead of a message about to be published on it."""
    acks = _DUE.get(nc)
    if acks is not None and acks.due:
        await acks.send()
