"""Keeps a reactor's background loop alive: a crash is logged with its traceback and the loop
restarts after an exponential backoff.

A background loop (the policy's approval expiry, the orchestrator's time-out watchdog, the
executor's lease keeper) must hold its own contract across restarts: it is re-entered from the
top, so it rebuilds whatever it needs from the log, never from state the crashed instance held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Delay before restart *n* (from 0): ``first_s * factor**n``, at most ``max_s``. A loop that
    ran ``reset_after_s`` before crashing starts again from ``first_s``."""

    first_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    reset_after_s: float = 60.0

    def delay(self, attempt: int) -> float:
        return min(self.max_s, self.first_s * self.factor ** min(attempt, 32))


@dataclass
class Supervised:
    """One supervised loop: its name, how often it was restarted, its last crash."""

    name: str
    restarts: int = 0
    last_error: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)


async def supervise(
    item: Supervised, loop: Callable[[], Awaitable[None]], backoff: Backoff = Backoff()
) -> None:
    """Run ``loop()`` until it returns or the task is cancelled, restarting it after a crash.

    Cancellation passes through (it is how a host stops the loop); every other exception is
    logged at ERROR with its traceback, counted in ``item.restarts`` and followed by a restart.
    """
    attempt = 0
    clock = asyncio.get_running_loop().time
    while True:
        started = clock()
        try:
            await loop()
            return
        except Exception as exc:  # a supervisor's job: log, count, restart
            if clock() - started >= backoff.reset_after_s:
                attempt = 0
            delay = backoff.delay(attempt)
            attempt += 1
            item.restarts += 1
            item.last_error = repr(exc)
            log.error(
                "background %s crashed (restart %d in %.1fs)",
                item.name,
                item.restarts,
                delay,
                exc_info=exc,
            )
            await asyncio.sleep(delay)
