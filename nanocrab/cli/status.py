"""What ``nanocrab status`` gathers: streams, handler consumers, projections, dead letters.

A projection's entry is its checkpoint (``position``), how many matching events it has not
applied (``behind``, counted by the server from the checkpoint on, so a projector that stopped
shows its lag), and the error it is stuck on (``error``, ``attempts``), if any. ``problems`` lists
what needs an operator (a full log refuses every new event: bus/failures.py calls it permanent).
"""

from __future__ import annotations

from typing import Any

from nats.js.api import DiscardPolicy, StreamInfo
from sqlalchemy import func, inspect, select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog
from nanocrab.bus.connection import stream_info
from nanocrab.projections import Projector, all_projections, dead_letters, failures


async def gather_status(log: EventLog, engine: AsyncEngine) -> dict[str, Any]:
    out: dict[str, Any] = {"streams": [], "consumers": [], "projections": [], "problems": []}
    for name in (log.cfg.log_stream, log.cfg.ephemeral_stream):
        info = await stream_info(log.js, name)  # waits out a leader election
        full = stream_full(info, log.cfg.max_event_bytes)
        out["streams"].append({
            "name": name, "messages": info.state.messages, "bytes": info.state.bytes,
            "first_seq": info.state.first_seq, "last_seq": info.state.last_seq,
            "max_bytes": info.config.max_bytes, "full": full,
            "cluster": stream_cluster(info),
        })  # fmt: skip
        trouble = cluster_problem(name, info)
        if trouble:
            out["problems"].append(trouble)
        if full and info.config.discard == DiscardPolicy.NEW:
            out["problems"].append(
                f"stream {name} is full ({info.state.bytes} of {info.config.max_bytes} bytes, "
                f"{info.state.messages} messages): new events are refused; raise its limit "
                "(log_max_bytes) or remove old data"
            )
    for c in await log.js.consumers_info(log.cfg.log_stream):
        if not c.config.durable_name:
            continue  # replay and tail use ephemeral consumers: not handlers
        out["consumers"].append({
            "name": c.name,
            "pending": c.num_pending,  # matching events not yet delivered
            "unacked": c.num_ack_pending,  # delivered, being handled (or about to be redelivered)
            "redelivered": c.num_redelivered,
            "behind": (c.num_pending or 0) + (c.num_ack_pending or 0),
            "last_seq": c.delivered.stream_seq if c.delivered else 0,
        })  # fmt: skip
    async with engine.connect() as conn:
        tables = set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))
        count = (
            await conn.scalar(select(func.count()).select_from(dead_letters))
            if dead_letters.name in tables
            else 0
        )
    out["dead_letters"] = int(count or 0)
    if "projection_checkpoints" in tables:
        stuck = await _failures(engine) if failures.name in tables else {}
        for projection in all_projections():
            projector = Projector(log, engine, projection)
            position = await projector.checkpoint()
            failure = stuck.get(projection.name)
            if failure is not None and position > failure["position"]:
                failure = None  # it has applied events since: the failure is history
            out["projections"].append({
                "name": projection.name,
                "position": position,
                "behind": await projector.behind(),
                "error": failure["error"] if failure else None,
                "attempts": failure["attempts"] if failure else 0,
            })  # fmt: skip
    return out


def stream_cluster(info: StreamInfo) -> dict[str, Any] | None:
    """A replicated stream's health: its RAFT group's leader and each replica (``current``:
    caught up with the leader; ``offline``: its node is unreachable; ``lag`` in operations);
    ``None`` on a single server."""
    cluster = info.cluster
    if cluster is None or cluster.name is None:
        return None
    return {
        "name": cluster.name,
        "leader": cluster.leader,
        "replicas": [
            {"name": p.name, "current": bool(p.current), "offline": bool(p.offline),
             "lag": p.lag or 0}
            for p in cluster.replicas or []
        ],
    }  # fmt: skip


def cluster_problem(name: str, info: StreamInfo) -> str | None:
    """What an operator should know about a replicated stream: no leader (appends fail until
    one is elected), or replicas offline or behind (one more loss may cost the quorum)."""
    health = stream_cluster(info)
    if health is None:
        return None
    if not health["leader"]:
        return f"stream {name} has no leader in cluster {health['name']}: appends wait"
    down = [r["name"] for r in health["replicas"] if r["offline"] or not r["current"]]
    if down:
        return (
            f"stream {name}: replica(s) {', '.join(down)} offline or catching up "
            f"(leader {health['leader']}); the stream is served while a quorum is up"
        )
    return None


def stream_full(info: StreamInfo, event_bytes: int) -> bool:
    """Whether the stream may refuse the next event: within ``event_bytes`` of its byte limit,
    or at its message limit (a ``-1``/``0`` limit is none)."""
    limit_bytes, limit_msgs = info.config.max_bytes or -1, info.config.max_msgs or -1
    return (0 < limit_bytes <= info.state.bytes + event_bytes) or (
        0 < limit_msgs <= info.state.messages
    )


async def _failures(engine: AsyncEngine) -> dict[str, dict[str, Any]]:
    """The last recorded failure of each projection (``projection_failures``), by name."""
    async with engine.connect() as conn:
        rows = (await conn.execute(select(failures))).mappings().all()
    return {r["name"]: dict(r) for r in rows}
