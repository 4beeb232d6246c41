"""What ``nanocrab status`` gathers: streams, handler consumers, projections, dead letters.

A projection's entry is its checkpoint (``position``), how many matching events it has not
applied (``behind``, counted by the server from the checkpoint on, so a projector that stopped
shows its lag), and the error it is stuck on (``error``, ``attempts``), if any.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, inspect, select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog
from nanocrab.projections import Projector, all_projections, dead_letters, failures


async def gather_status(log: EventLog, engine: AsyncEngine) -> dict[str, Any]:
    out: dict[str, Any] = {"streams": [], "consumers": [], "projections": []}
    for name in (log.cfg.log_stream, log.cfg.ephemeral_stream):
        info = await log.js.stream_info(name)
        out["streams"].append({
            "name": name, "messages": info.state.messages, "bytes": info.state.bytes,
            "first_seq": info.state.first_seq, "last_seq": info.state.last_seq,
        })  # fmt: skip
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


async def _failures(engine: AsyncEngine) -> dict[str, dict[str, Any]]:
    """The last recorded failure of each projection (``projection_failures``), by name."""
    async with engine.connect() as conn:
        rows = (await conn.execute(select(failures))).mappings().all()
    return {r["name"]: dict(r) for r in rows}
