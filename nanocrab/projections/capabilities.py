"""The capability registry: what is registered, which version is current, how it performs.

Built from ``capability.*``: ``registered`` makes a version current. A capability registered
for the first time (or again after its removal) is *disabled* until someone enables it (the user
decides, seed 001: ``nanocrab capabilities enable NAME``, or ``generate --enable``); a newer
version of a registered one keeps the status the user gave it. ``enabled`` / ``disabled`` /
``removed`` change what may be invoked, ``invoked`` adds a row to the invocation statistics.
Generation attempts that were never registered leave no trace here (they are in the log).
Each event is applied once by id (``capabilities_applied_events``), so the log may hold a second
copy of one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    func,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from nanocrab.bus import Stored, Subjects
from nanocrab.capabilities.deps import Node
from nanocrab.events import (
    CapabilityAutoEnabled,
    CapabilityDisabled,
    CapabilityEnabled,
    CapabilityInvoked,
    CapabilityRegistered,
    CapabilityRemoved,
)
from nanocrab.projections.db import (
    StreamSeq,
    applied_events,
    as_utc,
    bulk_insert,
    first_copies,
    metadata,
)

capabilities = Table(
    "capabilities",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("version", String(64), nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("removed", Boolean, nullable=False),
    Column("safety_level", String(16), nullable=False),
    Column("description", Text, nullable=False),
    Column("entry", String(128), nullable=False),
    Column("parameters", Text, nullable=False),  # JSON Schema, as JSON text
    Column("permissions", Text, nullable=False),  # JSON list
    Column("content_hash", String(64), nullable=False),
    Column("status_reason", Text, nullable=False, default=""),
    Column("registered_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("user_guidance", Text, nullable=False, default=""),
    Column("requires", Text, nullable=False, default="[]"),  # JSON list of capability names
)

capability_versions = Table(
    "capability_versions",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("version", String(64), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("safety_level", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),  # generation attempts it took to pass
    Column("registered_at", DateTime(timezone=True), nullable=False),
    Column("code", Text, nullable=False),  # the module, inline as in capability.registered
)

capability_invocations = Table(
    "capability_invocations",
    metadata,
    Column("seq", StreamSeq, primary_key=True, autoincrement=False),
    Column("name", String(128), nullable=False),
    Column("version", String(64), nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("duration_ms", Float, nullable=False),
    Column("peak_memory_bytes", BigInteger, nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("error", Text),
    Index("ix_capability_invocations_name", "name", "seq"),
)

capability_events = applied_events("capabilities")
"""Every capability event applied, by id: a second copy of one (say a ``disabled`` re-sent after
an ``enabled``) changes nothing."""


class CapabilitiesProjection:
    name = "capabilities"
    tables = (capabilities, capability_versions, capability_invocations, capability_events)

    def subject_filter(self, subjects: Subjects) -> str:
        return f"{subjects.root}.*.capability.>"

    async def apply(self, conn: AsyncConnection, batch: Sequence[Stored]) -> None:
        invocations: list[dict[str, Any]] = []
        relevant = [s for s in batch if isinstance(s.event, _KINDS)]
        for s in await first_copies(conn, capability_events, relevant):
            match s.event:
                case CapabilityRegistered() as e:
                    await _register(conn, s.seq, e)
                case CapabilityEnabled() as e if await _may_enable(conn, e):
                    await _set_status(conn, e.name, e.time, enabled=True, reason="")
                case CapabilityDisabled(name=name, time=t, reason=reason):
                    await _set_status(conn, name, t, enabled=False, reason=reason)
                case CapabilityRemoved(name=name, time=t, reason=reason):
                    await _set_status(conn, name, t, enabled=False, removed=True, reason=reason)
                case CapabilityInvoked() as e:
                    invocations.append({
                        "seq": s.seq, "name": e.name, "version": e.version, "time": e.time,
                        "duration_ms": e.duration_ms, "peak_memory_bytes": e.peak_memory_bytes,
                        "ok": e.ok, "outcome": e.outcome, "error": e.error,
                    })  # fmt: skip
                case _:
                    continue
        await bulk_insert(conn, capability_invocations, invocations)


_KINDS = (
    CapabilityRegistered, CapabilityEnabled, CapabilityDisabled, CapabilityRemoved,
    CapabilityInvoked,
)  # fmt: skip
"""What changes the registry (the rest of ``capability.*`` is generation history)."""


AWAITING = "new: not enabled yet"
"""The status reason of a capability nobody has enabled since it was registered."""
NEW_VERSION = "new version: not enabled yet (the one before was)"
"""The status reason of an enabled capability's new code: a person enables each code."""


async def _may_enable(conn: AsyncConnection, e: CapabilityEnabled) -> bool:
    """Whether the registry believes an enabling: of the capability's current version (a
    person enables the code they saw), and, from the generator (``capability.auto_enabled``),
    only of a capability nobody has enabled or disabled since it was registered."""
    row = (
        await conn.execute(
            select(capabilities.c.version, capabilities.c.enabled, capabilities.c.removed,
                   capabilities.c.status_reason).where(capabilities.c.name == e.name)
        )
    ).first()  # fmt: skip
    if row is None or row.removed or row.version != e.version:
        return False
    if isinstance(e, CapabilityAutoEnabled):
        return not row.enabled and row.status_reason == AWAITING
    return True


async def _register(conn: AsyncConnection, seq: int, e: CapabilityRegistered) -> None:
    exists = await conn.scalar(
        select(func.count())
        .select_from(capability_versions)
        .where(capability_versions.c.name == e.name, capability_versions.c.version == e.version)
    )
    if not exists:
        await conn.execute(
            capability_versions.insert().values(
                name=e.name, version=e.version, seq=seq, content_hash=e.content_hash,
                safety_level=e.safety_level, attempts=e.attempt, registered_at=e.time, code=e.code,
            )
        )  # fmt: skip
    values = {
        "version": e.version, "safety_level": e.safety_level, "description": e.description,
        "entry": e.entry, "parameters": json.dumps(e.parameters),
        "permissions": json.dumps(e.permissions), "content_hash": e.content_hash,
        "registered_at": e.time, "updated_at": e.time, "removed": False,
        "user_guidance": e.user_guidance, "requires": json.dumps(sorted(e.requires)),
    }  # fmt: skip
    row = (
        await conn.execute(
            select(capabilities.c.enabled, capabilities.c.removed,
                   capabilities.c.content_hash).where(capabilities.c.name == e.name)
        )
    ).first()  # fmt: skip
    if row is None:
        await conn.execute(
            capabilities.insert().values(
                name=e.name, enabled=False, status_reason=AWAITING, **values
            )
        )
        return
    if row.removed:  # generated again after a removal: back, and waiting for the user again
        values.update(enabled=False, status_reason=AWAITING)
    elif row.enabled and row.content_hash != e.content_hash:
        # other code under the enabled name: it waits for a person (capabilities/pin.py)
        values.update(enabled=False, status_reason=NEW_VERSION)
    await conn.execute(update(capabilities).where(capabilities.c.name == e.name).values(**values))


async def _set_status(
    conn: AsyncConnection,
    name: str,
    time: datetime,
    *,
    enabled: bool,
    reason: str,
    removed: bool = False,
) -> None:
    """Enable/disable/remove a registered capability; a status event for a name that was never
    registered (or is removed, for enable/disable) changes nothing."""
    query = update(capabilities).where(capabilities.c.name == name)
    if not removed:
        query = query.where(capabilities.c.removed.is_(False))
    await conn.execute(
        query.values(enabled=enabled, removed=removed, status_reason=reason, updated_at=time)
    )


@dataclass(frozen=True, slots=True)
class CapabilityRow:
    name: str
    version: str
    enabled: bool
    removed: bool
    safety_level: str
    description: str
    entry: str
    parameters: dict[str, Any]
    permissions: list[str]
    content_hash: str
    status_reason: str
    registered_at: datetime
    updated_at: datetime
    user_guidance: str = ""
    requires: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``enabled``, ``disabled`` or ``removed``."""
        if self.removed:
            return "removed"
        return "enabled" if self.enabled else "disabled"


@dataclass(frozen=True, slots=True)
class VersionRow:
    version: str
    content_hash: str
    safety_level: str
    attempts: int
    registered_at: datetime
    code: str


@dataclass(frozen=True, slots=True)
class CapabilityDetail:
    """One capability: its registry row, every registered version (oldest first), the code of
    the current version."""

    row: CapabilityRow
    versions: list[VersionRow]

    @property
    def code(self) -> str:
        return next((v.code for v in self.versions if v.version == self.row.version), "")


class CapabilityStats(NamedTuple):
    """Invocation statistics. Times in milliseconds; ``success_rate`` in [0, 1]; ``None``
    where there are no invocations to average."""

    count: int  # type: ignore[assignment]  # the field shadows tuple.count, on purpose
    success_rate: float | None
    avg_ms: float | None
    p95_ms: float | None
    peak_memory_bytes: int | None


def _row(r: Any) -> CapabilityRow:
    return CapabilityRow(
        name=r["name"], version=r["version"], enabled=bool(r["enabled"]),
        removed=bool(r["removed"]), safety_level=r["safety_level"],
        description=r["description"], entry=r["entry"],
        parameters=json.loads(r["parameters"]), permissions=json.loads(r["permissions"]),
        content_hash=r["content_hash"], status_reason=r["status_reason"] or "",
        registered_at=as_utc(r["registered_at"]), updated_at=as_utc(r["updated_at"]),
        user_guidance=r["user_guidance"] or "", requires=json.loads(r["requires"] or "[]"),
    )  # fmt: skip


async def list_capabilities(
    engine: AsyncEngine, *, include_removed: bool = False
) -> list[CapabilityRow]:
    """Every registered capability by name (removed ones only when asked for)."""
    query = select(capabilities).order_by(capabilities.c.name)
    if not include_removed:
        query = query.where(capabilities.c.removed.is_(False))
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [_row(r) for r in rows]


def dependency_nodes(rows: Sequence[CapabilityRow]) -> dict[str, Node]:
    """The registry as :mod:`nanocrab.capabilities.deps` sees it (pass removed rows too)."""
    return {
        r.name: Node(enabled=r.enabled, removed=r.removed, requires=tuple(r.requires)) for r in rows
    }


async def capability(engine: AsyncEngine, name: str) -> CapabilityDetail | None:
    """One capability with its versions, or ``None`` if it was never registered."""
    async with engine.connect() as conn:
        row = (
            (await conn.execute(select(capabilities).where(capabilities.c.name == name)))
            .mappings()
            .first()
        )
        if row is None:
            return None
        versions = (
            (
                await conn.execute(
                    select(capability_versions)
                    .where(capability_versions.c.name == name)
                    .order_by(capability_versions.c.seq)
                )
            )
            .mappings()
            .all()
        )
    return CapabilityDetail(row=_row(row), versions=[_version(v) for v in versions])


def _version(v: Any) -> VersionRow:
    return VersionRow(
        version=v["version"], content_hash=v["content_hash"], safety_level=v["safety_level"],
        attempts=v["attempts"], registered_at=as_utc(v["registered_at"]), code=v["code"],
    )  # fmt: skip


async def capability_stats(
    engine: AsyncEngine, name: str, *, version: str | None = None
) -> CapabilityStats:
    """Invocation count, success rate, average and 95th-percentile duration (nearest rank),
    and the highest peak memory — of every version, or of ``version``."""
    query = select(
        capability_invocations.c.duration_ms,
        capability_invocations.c.ok,
        capability_invocations.c.peak_memory_bytes,
    ).where(capability_invocations.c.name == name)
    if version is not None:
        query = query.where(capability_invocations.c.version == version)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    if not rows:
        return CapabilityStats(0, None, None, None, None)
    durations = sorted(float(r.duration_ms) for r in rows)
    count = len(rows)
    return CapabilityStats(
        count=count,
        success_rate=sum(1 for r in rows if r.ok) / count,
        avg_ms=sum(durations) / count,
        p95_ms=durations[max(0, math.ceil(0.95 * count) - 1)],
        peak_memory_bytes=max(int(r.peak_memory_bytes) for r in rows),
    )
