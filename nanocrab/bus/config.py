"""Typed bus configuration; only the CLI fills it from the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nanocrab.events import DEFAULT_MAX_EVENT_BYTES


class BusConfig(BaseModel):
    """Where the bus is and how its streams are shaped.

    ``root`` is the first subject token and names the streams (``NANOCRAB_LOG``,
    ``NANOCRAB_EPHEMERAL``); tests use a fresh root per test to share one server.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = None
    """An external server or cluster (``NANOCRAB_NATS_URL``); ``None`` starts the embedded one."""
    data_dir: Path = Path(".nanocrab")
    root: str = Field(default="nanocrab", pattern=r"^[a-z][a-z0-9_-]*$")
    max_event_bytes: int = Field(default=DEFAULT_MAX_EVENT_BYTES, gt=1024)
    """Events above this are refused by the codec; the log stream accepts up to
    ``max_msg_bytes`` so that foreign oversized messages land (and are dead-lettered) rather than
    vanish at the publisher."""
    max_msg_bytes: int = 1024 * 1024
    duplicate_window_s: float = Field(default=120.0, ge=120.0)
    log_max_bytes: int = -1
    """-1 is unlimited; with a limit the log refuses new events when full (discard-new)."""
    replicas: int = Field(default=1, ge=1, le=5)
    """Copies of every stream and of the artifact bucket: 1 on the embedded server, 3 on a
    three-node cluster (``NANOCRAB_STREAM_REPLICAS``), so a stream survives losing a node."""
    placement_cluster: str | None = None
    """Place the streams in this NATS cluster (``NANOCRAB_STREAM_PLACEMENT=cluster[:tag,…]``);
    ``None``: wherever the server puts them."""
    placement_tags: tuple[str, ...] = ()
    """Server tags every replica's node must carry (``server_tags`` in its config)."""
    storage: Literal["file", "memory"] = "file"
    ephemeral_ttl_s: float = 3600.0
    ephemeral_max_age_s: float = 24 * 3600.0
    append_timeout_s: float = 5.0
    auth: bool | None = None
    """Broker permissions (DESIGN §8, docs/security.md): each connection authenticates as its
    identity with the nkey seed in ``keys_dir``. ``None`` means on for the embedded server (which
    is then configured with them) and off for an external ``url`` (``NANOCRAB_NATS_AUTH``)."""

    @property
    def authenticated(self) -> bool:
        return self.auth if self.auth is not None else self.url is None

    @property
    def keys_dir(self) -> Path:
        """The data directory's identities (``<data_dir>/keys``, one ``<name>.nk`` seed each)."""
        return self.data_dir / "keys"

    @property
    def log_stream(self) -> str:
        return f"{self.root.upper().replace('-', '_')}_LOG"

    @property
    def ephemeral_stream(self) -> str:
        return f"{self.root.upper().replace('-', '_')}_EPHEMERAL"

    @property
    def ephemeral_root(self) -> str:
        return f"{self.root}_eph"
