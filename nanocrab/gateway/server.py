"""Serving the gateway with uvicorn inside an already running event loop (``nanocrab up``,
``nanocrab gateway``, tests and the benchmark): the caller owns the loop and the signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

import uvicorn
from fastapi import FastAPI

from nanocrab.gateway.errors import GatewayError

log = logging.getLogger(__name__)


class _Embedded(uvicorn.Server):
    """A uvicorn server that leaves SIGINT/SIGTERM to the process that embeds it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serving(app: FastAPI, host: str, port: int) -> AsyncIterator[uvicorn.Server]:
    """Serve ``app`` on ``host:port`` until the block exits; raises :class:`GatewayError` if the
    address cannot be bound. Open streams are closed on exit (a client resumes elsewhere)."""
    config = uvicorn.Config(
        app, host=host, port=port, lifespan="off", log_level="warning", ws="websockets-sansio",
        http="httptools",
        access_log=False, timeout_graceful_shutdown=2,
    )  # fmt: skip
    server = _Embedded(config)
    task = asyncio.create_task(server.serve(), name="gateway")
    while not server.started:
        if task.done():
            exc = task.exception() if not task.cancelled() else None
            raise GatewayError(f"the gateway could not listen on {host}:{port}: {exc!r}") from exc
        await asyncio.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, 10)
        except TimeoutError:
            log.warning("the gateway did not stop within 10 s; cancelled")
