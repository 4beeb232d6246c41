"""The cluster pieces: node configs, a real three-node cluster with R3 streams surviving a node,
handler-host keys, and the replica / placement settings."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from nats.js.api import StreamInfo

from nanocrab.bus import BusConfig, BusError, Connector
from nanocrab.bus.cluster import LocalCluster, NodeSpec, node_config
from nanocrab.bus.connection import stream_configs
from nanocrab.bus.permissions import CLI
from nanocrab.cli.agent import new_task
from nanocrab.cli.host import seed_source, server_authorization
from nanocrab.cli.provision import HostKeys, export_host_keys
from nanocrab.cli.settings import Settings
from nanocrab.cli.status import cluster_problem, stream_cluster
from nanocrab.security import KeyFileError, KeyRing

from .conftest import eventually


def test_a_node_routes_to_its_peers_and_includes_the_authorization() -> None:
    nodes = [NodeSpec(name=f"n{i}", cluster_port=6000 + i) for i in (1, 2, 3)]
    conf = node_config(nodes[0], nodes, store_dir="/data/js", cluster_name="c")
    assert '"nats-route://127.0.0.1:6002"' in conf and '"nats-route://127.0.0.1:6003"' in conf
    assert ':6001"' in conf and "nats-route://127.0.0.1:6001" not in conf  # listens, no self-route
    assert 'include "auth.conf"' in conf
    assert 'include "auth.conf"' not in node_config(
        nodes[0], nodes, store_dir="/d", authorization=False
    )


def test_a_handler_host_has_its_own_seed_and_only_public_keys_of_others(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path / "all")
    export_host_keys(ring, "executor", tmp_path / "exec")
    assert sorted(p.name for p in (tmp_path / "exec").iterdir()) == [
        "approver.pub", "executor.nk", "policy.pub",
    ]  # fmt: skip
    host = HostKeys(tmp_path / "exec")
    assert host.public_key("policy") == ring.public_key("policy")
    assert host.seed("executor") == ring.seed("executor")
    with pytest.raises(KeyFileError, match="no nkey seed for 'policy'"):
        host.seed("policy")
    public_only = host.keypair("policy")  # what the wiring builds (and never runs) there
    assert public_only.public_key.decode() == ring.public_key("policy")
    with pytest.raises(AttributeError):  # nkeys: a public-key-only pair has no signing key
        public_only.sign(b"forged grant")
    with pytest.raises(KeyFileError, match=r"neither llm\.nk nor llm\.pub"):
        host.public_key("llm")
    with pytest.raises(ValueError, match="unknown handler"):
        export_host_keys(ring, "admin", tmp_path / "nope")


def test_replicas_and_placement_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NANOCRAB_HOME", str(tmp_path))
    monkeypatch.setenv("NANOCRAB_STREAM_REPLICAS", "3")
    monkeypatch.setenv("NANOCRAB_STREAM_PLACEMENT", "east:ssd,fast")
    cfg = Settings.from_env().bus()
    assert (cfg.replicas, cfg.placement_cluster, cfg.placement_tags) == (3, "east", ("ssd", "fast"))
    log, eph = stream_configs(cfg)
    assert log.num_replicas == eph.num_replicas == 3
    assert log.placement is not None and log.placement.cluster == "east"
    assert log.placement.tags == ["ssd", "fast"]
    monkeypatch.setenv("NANOCRAB_STREAM_REPLICAS", "7")
    with pytest.raises(ValueError, match="NANOCRAB_STREAM_REPLICAS"):
        Settings.from_env()
    monkeypatch.delenv("NANOCRAB_STREAM_REPLICAS")
    monkeypatch.delenv("NANOCRAB_STREAM_PLACEMENT")
    default = Settings.from_env().bus()
    assert default.replicas == 1 and stream_configs(default)[0].placement is None


async def test_r3_streams_keep_taking_appends_with_a_node_down(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path / "keys")
    cfg = BusConfig(data_dir=tmp_path, auth=True, replicas=3, root=f"t{uuid.uuid4().hex[:8]}")
    cluster = LocalCluster(tmp_path / "cluster", authorization=server_authorization(ring, cfg))
    url = cluster.start()
    cfg = cfg.model_copy(update={"url": url})
    connector = Connector(url, cfg, seeds=seed_source(ring, create=False), name="test-cluster")
    try:
        await connector.setup()
        log = await connector.open(CLI)

        async def settled() -> StreamInfo | None:
            # a new stream's replicas may still be catching up on a loaded machine
            info = await log.js.stream_info(cfg.log_stream)
            return info if cluster_problem(cfg.log_stream, info) is None else None

        info = await eventually(settled)
        health = stream_cluster(info)
        assert health is not None and len(health["replicas"]) == 2 and health["leader"]
        await log.append(new_task("before", "default", None))

        cluster.kill(health["leader"])  # the stream's leader dies
        during = new_task("during", "default", None)

        async def appended() -> int:
            try:  # refused or unacknowledged while a leader is elected: retried, as handlers do
                return (await log.append(during)).seq  # the same id: never stored twice
            except BusError:
                return 0

        assert await eventually(appended, timeout=30, interval=0.5) == 2

        async def degraded() -> str | None:
            return cluster_problem(cfg.log_stream, await log.js.stream_info(cfg.log_stream))

        assert health["leader"] in await eventually(degraded, timeout=30)
        cluster.restart(health["leader"])

        async def healed() -> bool:
            return await degraded() is None

        await eventually(healed, timeout=60)
    finally:
        await connector.close()
        cluster.stop()


def test_a_port_taken_between_choosing_and_binding_is_chosen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two test workers starting clusters at once: a free port one chose was bound by the other
    before its node started (seen in a CI run: "bind: address already in use")."""
    import dataclasses
    import socket

    from nanocrab.bus import cluster as cluster_module

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    chosen = cluster_module.loopback_nodes
    calls: list[int] = []

    def first_one_taken(count: int, *, host: str = "127.0.0.1") -> list[NodeSpec]:
        nodes = chosen(count, host=host)
        calls.append(count)
        if len(calls) == 1:
            nodes[0] = dataclasses.replace(nodes[0], client_port=taken.getsockname()[1])
        return nodes

    monkeypatch.setattr(cluster_module, "loopback_nodes", first_one_taken)
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        cluster.start()
        assert len(calls) == 2 and cluster.nodes[0].client_port != taken.getsockname()[1]
    finally:
        cluster.stop()
        taken.close()
