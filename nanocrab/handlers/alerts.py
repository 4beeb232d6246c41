"""The alert webhook: ``alert.raised`` events POSTed as JSON to a configured URL.

Never on a run's path: the guardrails handler hands each alert to :meth:`AlertSink.send`, which
only queues it (a bounded queue; when full, the oldest alert is dropped and counted); the
handler's background loop posts them, retrying a failed POST with exponential backoff
(tenacity) and giving up after ``attempts``. The log stays the record: a lost webhook call loses
a notification, never the alert. A redelivered event may post an alert twice (at least once);
the body carries the alert's event id to deduplicate on.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import msgspec
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from nanocrab.events import AlertRaised

log = logging.getLogger(__name__)


class AlertSink:
    """Posts alerts to ``url``; ``transport`` is for tests (an ``httpx.MockTransport``)."""

    def __init__(
        self,
        url: str,
        *,
        attempts: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        timeout_s: float = 5.0,
        capacity: int = 1000,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self.transport = transport
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=capacity)
        self.sent = 0
        self.failed = 0
        self.dropped = 0

    def send(self, alert: AlertRaised, *, run_id: str | None = None) -> None:
        """Queue ``alert`` for posting; returns at once."""
        body = msgspec.json.encode({"type": alert.type, "id": alert.id, "run_id": run_id,
                                    "data": msgspec.to_builtins(alert)})  # fmt: skip
        if self.queue.full():
            self.queue.get_nowait()
            self.dropped += 1
        self.queue.put_nowait(body)

    async def run(self) -> None:
        """Post queued alerts, one at a time, forever."""
        async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as client:
            while True:
                body = await self.queue.get()
                try:
                    await self._post(client, body)
                    self.sent += 1
                except httpx.HTTPError as exc:
                    self.failed += 1
                    log.warning("alert webhook %s: gave up after %d attempts: %r",
                                self.url, self.attempts, exc)  # fmt: skip

    async def _post(self, client: httpx.AsyncClient, body: bytes) -> None:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception_type(httpx.HTTPError),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                response = await client.post(
                    self.url, content=body, headers={"content-type": "application/json"}
                )
                response.raise_for_status()
