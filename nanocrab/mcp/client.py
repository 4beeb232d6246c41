"""MCP client sessions: one per server, owned by the process that calls the tools (the executor).

A :class:`Connection` runs its transport (``stdio_client`` or ``streamable_http_client``) and
its ``ClientSession`` in a task of its own — the SDK's transports are anyio task groups that
must be entered and left in one task — and hands the live session to callers in other tasks.
It connects on first use, with the server's secrets resolved at that moment (never stored in
an event), and again after the server went away.

A call (:meth:`Connection.call`) ends in exactly one of: the server's result; or an
:class:`McpCallError` whose ``kind`` is a tool error kind — ``unavailable`` (the server could
not be started or reached, or went away during the call: its stdio process exited, its HTTP
endpoint closed), ``timeout``, ``aborted`` (the run was cancelled). A dead server never leaves a
call waiting: the call races the connection's own task, which ends when the transport does, and
— over HTTP, where a response stream that breaks leaves the SDK's request pending — a ping every
``ping_interval`` seconds, whose failure means the server is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TextIO, TypeVar

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters
from mcp import types as mt
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError as SdkError
from pydantic import AnyUrl

from nanocrab.mcp.config import McpConfig, McpError, ServerSpec

log = logging.getLogger(__name__)

CallErrorKind = Literal["unavailable", "timeout", "aborted", "failed"]
T = TypeVar("T")


class McpCallError(McpError):
    """A call that did not get a result from the server; ``kind`` says why (module docstring)."""

    def __init__(self, kind: CallErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: CallErrorKind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class Listing:
    """What a server offers, as it described it (descriptions are untrusted text)."""

    tools: list[mt.Tool]
    resources: list[mt.Resource]
    templates: list[mt.ResourceTemplate]
    prompts: list[mt.Prompt]


class Connection:
    """The session with one server (see the module docstring)."""

    def __init__(
        self,
        name: str,
        spec: ServerSpec,
        config: McpConfig,
        environ: Mapping[str, str],
        *,
        log_dir: Path | None = None,
    ) -> None:
        """``log_dir``: where a stdio server's stderr goes (``<server>.log``, appended);
        ``None``: this process's stderr."""
        self.name = name
        self.log_dir = log_dir
        self.spec = spec
        self.config = config
        self._environ = environ
        self._task: asyncio.Task[None] | None = None
        self._session: ClientSession | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def session(self) -> ClientSession:
        """The live session, connecting first when there is none (or the last one ended)."""
        async with self._lock:
            if self._session is not None and self._task is not None and not self._task.done():
                return self._session
            await self._drop()
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._serve(ready), name=f"mcp-{self.name}")
            try:
                self._session = await asyncio.wait_for(
                    asyncio.shield(ready), self.config.connect_timeout
                )
            except TimeoutError:
                await self._drop()
                raise McpCallError(
                    "unavailable",
                    f"MCP server {self.name!r} ({self.spec.where()}) did not answer the handshake "
                    f"within {self.config.connect_timeout:g} s",
                ) from None
            except McpCallError:
                await self._drop()
                raise
            return self._session

    async def _serve(self, ready: asyncio.Future[ClientSession]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.spec.command is not None:
                    errlog: TextIO = sys.stderr
                    if self.log_dir is not None:
                        self.log_dir.mkdir(parents=True, exist_ok=True)
                        path = self.log_dir / f"{self.name}.log"
                        errlog = stack.enter_context(path.open("a", encoding="utf-8"))
                    params = StdioServerParameters(
                        command=self.spec.command,
                        args=list(self.spec.args),
                        env=self.config.resolve(self.name, self.spec.env, self._environ),
                        cwd=self.spec.cwd,
                    )
                    read, write = await stack.enter_async_context(stdio_client(params, errlog))
                else:
                    assert self.spec.url is not None
                    headers = self.config.resolve(self.name, self.spec.headers, self._environ)
                    client = await stack.enter_async_context(
                        httpx.AsyncClient(
                            headers=headers,
                            timeout=httpx.Timeout(30.0, read=self.config.call_timeout + 30.0),
                        )
                    )
                    read, write, _ = await stack.enter_async_context(
                        streamable_http_client(self.spec.url, http_client=client)
                    )
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                ready.set_result(session)
                await self._stop.wait()
        except McpError as exc:  # a secret that cannot be resolved
            if not ready.done():
                ready.set_exception(McpCallError("unavailable", str(exc)))
        except Exception as exc:  # the transport's failure (often an ExceptionGroup), as data
            reason = _reason(exc)
            if not ready.done():
                ready.set_exception(
                    McpCallError(
                        "unavailable",
                        f"MCP server {self.name!r} ({self.spec.where()}) could not be started "
                        f"or reached: {reason}",
                    )
                )
            else:
                log.warning("MCP server %s went away: %s", self.name, reason)
        finally:
            if not ready.done():
                ready.set_exception(
                    McpCallError("unavailable", f"MCP server {self.name!r} closed at start-up")
                )

    async def list(self) -> Listing:
        """Tools, resources, resource templates and prompts (each only when the server
        declares that capability)."""
        session = await self.session()
        caps = session.get_server_capabilities()
        try:
            tools = await _all_tools(session) if caps is None or caps.tools else []
            resources: list[mt.Resource] = []
            templates: list[mt.ResourceTemplate] = []
            prompts: list[mt.Prompt] = []
            if caps is not None and caps.resources:
                resources = list((await session.list_resources()).resources)
                templates = list((await session.list_resource_templates()).resourceTemplates)
            if caps is not None and caps.prompts:
                prompts = list((await session.list_prompts()).prompts)
        except SdkError as exc:
            raise McpCallError("failed", f"MCP server {self.name!r}: {exc.error.message}") from exc
        return Listing(tools=tools, resources=resources, templates=templates, prompts=prompts)

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        time_limit: float,
        cancel: asyncio.Event | None = None,
    ) -> mt.CallToolResult:
        """Call ``tool`` for at most ``time_limit`` seconds; see the module docstring for
        how it can end."""
        limit = timedelta(seconds=time_limit)
        return await self._request(
            tool,
            lambda session: session.call_tool(tool, arguments, read_timeout_seconds=limit),
            time_limit=time_limit,
            cancel=cancel,
        )

    async def read(
        self, uri: str, *, time_limit: float, cancel: asyncio.Event | None = None
    ) -> mt.ReadResourceResult:
        """Read the resource ``uri``; it ends like :meth:`call`."""
        try:
            url = AnyUrl(uri)
        except ValueError as exc:
            raise McpCallError("failed", f"{uri!r} is not a resource URI: {exc}") from exc
        return await self._request(
            f"reading {uri}",
            lambda session: session.read_resource(url),
            time_limit=time_limit,
            cancel=cancel,
        )

    async def _request(
        self,
        tool: str,
        send: Callable[[ClientSession], Awaitable[T]],
        *,
        time_limit: float,
        cancel: asyncio.Event | None,
    ) -> T:
        timeout = time_limit
        session = await self.session()
        task = self._task
        assert task is not None
        call = asyncio.ensure_future(send(session))
        waiters: set[asyncio.Future[Any]] = {call, task}
        cancelled: asyncio.Task[bool] | None = None
        if cancel is not None:
            cancelled = asyncio.create_task(cancel.wait())
            waiters.add(cancelled)
        watchdog: asyncio.Task[None] | None = None
        if self.spec.url is not None:  # an HTTP stream that breaks leaves the request pending
            watchdog = asyncio.create_task(_watch(session, self.config.ping_interval))
            waiters.add(watchdog)
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for helper in (cancelled, watchdog):
                if helper is not None:
                    helper.cancel()
            if not call.done():
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call
        if call in done:
            try:
                return call.result()
            except SdkError as exc:
                if exc.error.code == mt.CONNECTION_CLOSED:
                    await self.close()
                    raise self._gone(tool) from exc
                if exc.error.code == httpx.codes.REQUEST_TIMEOUT:
                    raise McpCallError("timeout", _timed_out(self.name, tool, timeout)) from exc
                raise McpCallError(
                    "failed", f"MCP server {self.name!r} refused {tool}: {exc.error.message}"
                ) from exc
            except RuntimeError as exc:  # the SDK's check of structured output
                raise McpCallError(
                    "failed", f"MCP server {self.name!r} answered {tool} wrongly: {exc}"
                ) from exc
            except (httpx.HTTPError, OSError) as exc:
                await self.close()
                raise McpCallError(
                    "unavailable", f"MCP server {self.name!r} failed during {tool}: {_reason(exc)}"
                ) from exc
        if task in done or (watchdog is not None and watchdog in done):
            await self.close()
            raise self._gone(tool)
        if cancelled is not None and cancelled in done:
            raise McpCallError("aborted", f"{tool} on MCP server {self.name!r} was cancelled")
        raise McpCallError("timeout", _timed_out(self.name, tool, timeout))

    def _gone(self, tool: str) -> McpCallError:
        return McpCallError(
            "unavailable",
            f"MCP server {self.name!r} ({self.spec.where()}) went away during {tool}: the "
            "connection closed before it answered. The call's effects are unknown; the next "
            "call connects again.",
        )

    async def close(self) -> None:
        """End the session (and a stdio server's process)."""
        async with self._lock:
            await self._drop()

    async def _drop(self) -> None:
        task, self._task, self._session = self._task, None, None
        if task is None:
            return
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 5.0)
        except (TimeoutError, Exception):  # closing a failed transport
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


class McpHub:
    """The sessions with every enabled server of ``config``; ``environ`` resolves ``${NAME}``
    references. The executor owns one; nothing else connects for calls."""

    def __init__(
        self, config: McpConfig, environ: Mapping[str, str], *, log_dir: Path | None = None
    ) -> None:
        self.config = config
        self.connections = {
            name: Connection(name, spec, config, environ, log_dir=log_dir)
            for name, spec in config.enabled().items()
        }

    def connection(self, server: str) -> Connection:
        try:
            return self.connections[server]
        except KeyError:
            raise McpCallError("unavailable", f"no MCP server named {server!r}") from None

    async def close(self) -> None:
        for conn in self.connections.values():
            await conn.close()


async def _watch(session: ClientSession, every: float) -> None:
    """Ping the server every ``every`` seconds; return when a ping fails (the server is gone).
    A ping that is merely slow is not a failure: a busy server is still there."""
    while True:
        await asyncio.sleep(every)
        try:
            await session.send_ping()
        except (SdkError, httpx.HTTPError, OSError, anyio.ClosedResourceError,
                anyio.BrokenResourceError):  # fmt: skip
            return


async def _all_tools(session: ClientSession) -> list[mt.Tool]:
    tools: list[mt.Tool] = []
    cursor: str | None = None
    for _ in range(100):  # a server paging forever is a broken server
        page = await session.list_tools(params=mt.PaginatedRequestParams(cursor=cursor))
        tools.extend(page.tools)
        cursor = page.nextCursor
        if not cursor:
            break
    return tools


def _timed_out(server: str, tool: str, timeout: float) -> str:
    return f"{tool} on MCP server {server!r} did not answer within {timeout:g} s"


def _reason(exc: BaseException) -> str:
    """The first leaf of an exception group, as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
