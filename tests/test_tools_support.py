"""Helpers shared by the ``test_tools_*`` files (no tests here)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from pathlib import Path
from typing import Literal

import psutil

from nanocrab.events import ArtifactRef
from nanocrab.tools import ArtifactStore, LocalOperations, ToolContext


class NoArtifacts:
    """For tests whose tool must not store artifacts: any ``put`` fails the test."""

    async def put(
        self, name: str, data: bytes, *, media_type: str = "text/plain", preview: str = ""
    ) -> ArtifactRef:
        raise AssertionError(f"unexpected artifact {name!r} ({len(data)} bytes)")


class MemoryArtifacts:
    """An in-memory object store keyed like the real one (``<sha256>/<name>``), for tests whose
    tool may store a large output or an image."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def put(
        self, name: str, data: bytes, *, media_type: str = "text/plain", preview: str = ""
    ) -> ArtifactRef:
        digest = hashlib.sha256(data).hexdigest()
        self.objects[f"{digest}/{name}"] = data
        return ArtifactRef(bucket="mem", key=f"{digest}/{name}", size=len(data), sha256=digest,
                           media_type=media_type, preview=preview)  # fmt: skip


class Recorder:
    """An output sink that records chunks in arrival order."""

    def __init__(self) -> None:
        self.chunks: list[tuple[Literal["stdout", "stderr"], str]] = []
        self.changed = asyncio.Event()

    async def __call__(self, stream: Literal["stdout", "stderr"], chunk: str) -> None:
        self.chunks.append((stream, chunk))
        self.changed.set()

    @property
    def text(self) -> str:
        return "".join(chunk for _, chunk in self.chunks)

    async def wait_for(self, needle: str, timeout: float = 5.0) -> None:
        async def seen() -> None:
            while needle not in self.text:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(seen(), timeout)


def make_ctx(
    workspace: Path,
    *,
    artifacts: ArtifactStore | None = None,
    ops: LocalOperations | None = None,
    **kwargs: object,
) -> ToolContext:
    return ToolContext(
        workspace=workspace.resolve(),
        ops=ops or LocalOperations(),
        artifacts=artifacts or NoArtifacts(),
        **kwargs,  # type: ignore[arg-type]
    )


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def sleep_marker() -> str:
    """A ``sleep`` duration no other process on this host uses (GNU sleep takes fractions), so
    ``sleep <marker>`` names a test's processes: a confined command's process ids are its own
    namespace's, not the host's, and another copy of the suite may run beside this one."""
    return f"100.{secrets.randbelow(10**9):09d}"


def sleeping(marker: str) -> list[psutil.Process]:
    """The live ``sleep <marker>`` processes of this host."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] == ["sleep", marker] and not gone(proc.pid):
            found.append(proc)
    return found
