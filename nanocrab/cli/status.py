"""What ``nanocrab status`` gathers: streams, handler consumers, projections, dead letters."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, inspect, select
from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import EventLog
from nanocrab.projections import Projector, all_projections, dead_letters


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
        for projection in all_projections():
            projector = Projector(log, engine, projection)
            out["projections"].append({
                "name": projection.name,
                "position": await projector.checkpoint(),
                "behind": await projector.behind(),
            })  # fmt: skip
    return out
