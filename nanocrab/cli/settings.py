"""Settings from the environment — the only place nanocrab reads it."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from nanocrab.bus import BusConfig
from nanocrab.bus.tracing import TraceExporter
from nanocrab.projections import default_url


class Settings(BaseModel):
    """Everything the CLI wires. Environment variables:

    ``NANOCRAB_HOME``      data directory (default ``./.nanocrab``): server store, SQLite, traces
    ``NANOCRAB_NATS_URL``  an external NATS server/cluster; unset starts the embedded server
    ``NANOCRAB_DB_URL``    SQLAlchemy URL for projections (default SQLite in the data directory),
                           e.g. ``postgresql+asyncpg://user@127.0.0.1:5432/nanocrab``
    ``NANOCRAB_TRACES``    ``console`` (to ``<home>/traces.jsonl``, default), ``otlp``, ``none``
    ``NANOCRAB_SYNC``      JetStream fsync policy of the embedded server: ``default`` or ``always``
    """

    model_config = ConfigDict(frozen=True)

    home: Path
    nats_url: str | None
    db_url: str
    traces: TraceExporter
    sync: str

    @classmethod
    def from_env(cls) -> Settings:
        home = Path(os.environ.get("NANOCRAB_HOME", ".nanocrab")).resolve()
        traces = os.environ.get("NANOCRAB_TRACES", "console")
        if traces not in ("console", "otlp", "none"):
            raise ValueError(f"NANOCRAB_TRACES={traces!r}: use console, otlp or none")
        return cls(
            home=home,
            nats_url=os.environ.get("NANOCRAB_NATS_URL") or None,
            db_url=os.environ.get("NANOCRAB_DB_URL") or default_url(home),
            traces=traces,  # type: ignore[arg-type]
            sync=os.environ.get("NANOCRAB_SYNC", "default"),
        )

    def bus(self) -> BusConfig:
        return BusConfig(url=self.nats_url, data_dir=self.home)
