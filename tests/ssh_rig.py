"""A real OpenSSH server on loopback for the ssh backend's tests.

Each server is Debian's ``/usr/sbin/sshd`` run in the foreground with its own configuration,
host key, client key and authorized_keys file in a temporary directory, on a free loopback
port, as the current user: nothing of the system's ssh configuration is read or changed. When
sshd runs as root it needs its privilege-separation directory (``/run/sshd``, normally made by
the service unit); it is created if missing. ``make test`` installs openssh-server.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True)
class Sshd:
    host: str
    port: int
    user: str
    client_key: Path  # the private key the server accepts
    known_hosts: Path  # a known_hosts file naming the server's host key
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _accepting(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until sshd accepts connections (polled; it fails the test if sshd exits)."""
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"sshd exited ({proc.returncode}): {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"sshd did not listen on {port}: {log.read_text()}") from None
            time.sleep(0.05)


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if not SSHD.exists():
        pytest.fail(
            f"{SSHD} is missing: the ssh backend's tests need Debian's openssh-server. "
            "Run `make test` (it installs it) or `apt-get install -y openssh-server`."
        )
    d = tmp_path / "sshd"
    d.mkdir()
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    host_key.write_private_key(d / "host_key")
    (d / "host_key").chmod(0o600)
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key.write_private_key(d / "client_key")
    (d / "client_key").chmod(0o600)
    client_key.write_public_key(d / "authorized_keys")
    port = _free_port()
    (d / "known_hosts").write_text(
        f"[127.0.0.1]:{port} {host_key.export_public_key().decode().strip()}\n"
    )
    user = getpass.getuser()
    home = d / "home"
    home.mkdir()
    (d / "sshd_config").write_text(
        f"Port {port}\n"
        "ListenAddress 127.0.0.1\n"
        f"HostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\n"
        f"AllowUsers {user}\n"
        "StrictModes no\n"
        "UsePAM no\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "Subsystem sftp internal-sftp\n"
        "LogLevel VERBOSE\n"
        # commands start in a home of their own: the account's shell start-up files (here
        # root's ~/.bashrc runs `pyenv rehash`, which printed lock errors into a command's
        # output when 14 shells started at once) are not part of what a test checks
        f"SetEnv HOME={home}\n"
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = d / "sshd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        _accepting(port, proc, log)
        yield Sshd("127.0.0.1", port, user, d / "client_key", d / "known_hosts", log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
