"""What another thread or process needs to reach the same bus and database as this one."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from nanocrab.bus import BusConfig, BusError, EventLog


@dataclass(frozen=True, slots=True)
class BusSpec:
    """How to open a connection of one's own as ``identity``: what a worker needs of a log."""

    url: str
    cfg: BusConfig
    identity: str
    seed: str | None = None  # the identity's nkey seed when broker permissions are on

    @classmethod
    def of(cls, log_: EventLog, identity: str) -> BusSpec:
        """The spec of an open ``log_``: the server it is connected to and the nkey seed it
        authenticated with (nats-py keeps it only as a private attribute)."""
        nc = log_.nc
        if nc.connected_url is None:
            raise BusError(f"the log of {identity!r} is not connected")
        seed: str | None = getattr(nc, "_nkeys_seed_str", None)
        return cls(nc.connected_url.geturl(), log_.cfg, identity, seed)


def reopenable(engine: AsyncEngine) -> str | None:
    """The URL another thread or process can open ``engine``'s database with (its password
    included), or ``None`` for a private in-memory SQLite database."""
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        return None
    return url.render_as_string(hide_password=False)
