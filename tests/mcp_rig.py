"""Real MCP servers for the tests: tests/mcp_server.py (FastMCP) over stdio and over streamable
HTTP on loopback, and the ``mcp.yaml`` that names them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from nanocrab.mcp import McpConfig, parse_mcp_config

SERVER = Path(__file__).with_name("mcp_server.py")
TOKEN = "s3cret-token-value"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stdio_yaml(name: str = "fx", *, evil: bool = False, extra: str = "") -> str:
    args = [str(SERVER), "stdio", *(["--evil"] if evil else [])]
    return (
        f"  {name}:\n    command: {sys.executable}\n    args: {args!r}\n"
        f"    env: {{TOKEN: '${{FX_TOKEN}}', EXPECTED_TOKEN: {TOKEN}}}\n{extra}"
    )


def config(servers: str, *, head: str = "") -> McpConfig:
    return parse_mcp_config(f"version: 1\ncall_timeout: 20\nconnect_timeout: 20\n{head}"
                            f"servers:\n{servers}")  # fmt: skip


ENV = {"FX_TOKEN": TOKEN}


@contextlib.asynccontextmanager
async def http_server(*, evil: bool = False) -> AsyncIterator[str]:
    """A FastMCP server on 127.0.0.1 in its own process; yields its URL (``.../mcp``)."""
    port = free_port()
    args = [sys.executable, str(SERVER), "http", str(port), *(["--evil"] if evil else [])]
    proc = await asyncio.create_subprocess_exec(
        *args, env={**os.environ, "EXPECTED_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(400):
            if proc.returncode is not None:
                raise RuntimeError(f"the MCP HTTP server exited with {proc.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError("the MCP HTTP server did not listen")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
