"""API tokens: per tenant, with scopes and a rate, stored hashed in ``<home>/gateway.db``.

A token is ``ncg_<id>_<secret>``: ``id`` names the row (shown in listings, used to revoke),
``secret`` is 32 random bytes (URL-safe base64) and only its SHA-256 is stored, so the file never
holds a usable token. SHA-256 rather than a slow password hash: the secret is random and long, so
there is nothing to brute-force, and every request checks one. The same file keeps the
``Idempotency-Key`` → run mapping of ``POST /v1/tasks`` and each chat channel's session.

The store is plain ``sqlite3`` (WAL): the CLI creates and revokes tokens while a gateway reads
them, and a revocation counts from the next request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from nanocrab.gateway.errors import GatewayError

Scope = Literal["submit", "read", "approve", "admin"]
SCOPES: Final[tuple[Scope, ...]] = ("submit", "read", "approve", "admin")
"""``submit``: tasks, messages, cancels. ``read``: runs, events, audit, capabilities.
``approve``: answer approvals (the gateway signs as the approver for this person).
``admin``: everything above."""

DEFAULT_RATE: Final = "20/second;600/minute"
_TOKEN = re.compile(r"^ncg_([A-Za-z0-9]{12})_([A-Za-z0-9_-]{20,})$")
_TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Token:
    """One token's row (never its secret). ``name`` is the person or system it was issued to;
    it is recorded as the approver of the approvals they answer."""

    id: str
    tenant: str
    name: str
    scopes: tuple[Scope, ...]
    rate: str
    created_at: datetime
    revoked_at: datetime | None

    def allows(self, scope: Scope) -> bool:
        return scope in self.scopes or "admin" in self.scopes


@dataclass(frozen=True, slots=True)
class Remembered:
    """What an ``Idempotency-Key`` already stands for."""

    run_id: str
    event_id: str
    body_hash: str
    published: bool


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_scopes(scopes: Iterable[str]) -> tuple[Scope, ...]:
    out: list[Scope] = []
    for s in scopes:
        if s not in SCOPES:
            raise GatewayError(f"unknown scope {s!r}; use {', '.join(SCOPES)}")
        out.append(s)
    if not out:
        raise GatewayError(f"a token needs at least one scope: {', '.join(SCOPES)}")
    return tuple(dict.fromkeys(out))


class TokenStore:
    """Tokens and idempotency keys in one SQLite file. Thread-safe (one connection, a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS tokens (
              id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL,
              scopes TEXT NOT NULL, rate TEXT NOT NULL, secret_sha256 TEXT NOT NULL,
              created_at TEXT NOT NULL, revoked_at TEXT);
            CREATE TABLE IF NOT EXISTS idempotency (
              tenant TEXT NOT NULL, key TEXT NOT NULL, run_id TEXT NOT NULL,
              event_id TEXT NOT NULL, body_sha256 TEXT NOT NULL, published INTEGER NOT NULL,
              created_at TEXT NOT NULL, PRIMARY KEY (tenant, key));
            CREATE TABLE IF NOT EXISTS channel_sessions (
              channel TEXT PRIMARY KEY, session_id TEXT NOT NULL);
            """
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def create(
        self, *, tenant: str, name: str, scopes: Iterable[str], rate: str = DEFAULT_RATE
    ) -> tuple[Token, str]:
        """A new token and its secret form (shown once; only its hash is kept)."""
        if not _TENANT.match(tenant):
            raise GatewayError(f"tenant {tenant!r}: use 1-64 letters, digits, - or _")
        if not name.strip():
            raise GatewayError("a token needs a name (the person or system it is for)")
        checked = check_scopes(scopes)
        check_rate(rate)
        ident = "".join(secrets.choice("abcdefghijkmnpqrstuvwxyz23456789") for _ in range(12))
        secret = secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        with self._lock:
            self._db.execute(
                "INSERT INTO tokens VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
                (ident, tenant, name, " ".join(checked), rate, _digest(secret), now.isoformat()),
            )
        token = Token(ident, tenant, name, checked, rate, now, None)
        return token, f"ncg_{ident}_{secret}"

    def verify(self, presented: str) -> Token | None:
        """The live token ``presented`` is, or ``None`` (malformed, unknown, wrong, revoked)."""
        m = _TOKEN.match(presented)
        if m is None:
            return None
        with self._lock:
            row = self._db.execute(
                "SELECT id, tenant, name, scopes, rate, created_at, revoked_at, secret_sha256 "
                "FROM tokens WHERE id = ?",
                (m.group(1),),
            ).fetchone()
        if row is None or row[6] is not None:
            return None
        if not hmac.compare_digest(row[7], _digest(m.group(2))):
            return None
        return _token(row)

    def list(self, *, tenant: str | None = None) -> list[Token]:
        query = "SELECT id, tenant, name, scopes, rate, created_at, revoked_at FROM tokens"
        args: tuple[str, ...] = ()
        if tenant is not None:
            query, args = query + " WHERE tenant = ?", (tenant,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at", args).fetchall()
        return [_token(r) for r in rows]

    def revoke(self, ident: str) -> bool:
        """Revoke by id; ``False`` if there is no live token with that id."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (datetime.now(UTC).isoformat(), ident),
            )
        return cur.rowcount == 1

    def remember(
        self, tenant: str, key: str, *, run_id: str, event_id: str, body_hash: str
    ) -> Remembered:
        """Claim ``key`` for this request; returns what the key stands for — this request's
        values if it was free, an earlier request's otherwise (compare ``event_id``)."""
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO idempotency VALUES (?, ?, ?, ?, ?, 0, ?)",
                (tenant, key, run_id, event_id, body_hash, datetime.now(UTC).isoformat()),
            )
            row = self._db.execute(
                "SELECT run_id, event_id, body_sha256, published FROM idempotency "
                "WHERE tenant = ? AND key = ?",
                (tenant, key),
            ).fetchone()
        return Remembered(row[0], row[1], row[2], bool(row[3]))

    def published(self, tenant: str, key: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE idempotency SET published = 1 WHERE tenant = ? AND key = ?", (tenant, key)
            )


    def session(self, channel: str) -> str | None:
        """The current session of a chat channel (``telegram:<tenant>:<chat id>``), if any."""
        with self._lock:
            row = self._db.execute(
                "SELECT session_id FROM channel_sessions WHERE channel = ?", (channel,)
            ).fetchone()
        return str(row[0]) if row else None

    def set_session(self, channel: str, session_id: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO channel_sessions VALUES (?, ?) ON CONFLICT(channel) DO UPDATE "
                "SET session_id = excluded.session_id",
                (channel, session_id),
            )


def _token(row: tuple[str, ...]) -> Token:
    return Token(
        id=row[0],
        tenant=row[1],
        name=row[2],
        scopes=check_scopes(row[3].split()),
        rate=row[4],
        created_at=datetime.fromisoformat(row[5]),
        revoked_at=datetime.fromisoformat(row[6]) if row[6] else None,
    )


def check_rate(rate: str) -> None:
    """Raise :class:`GatewayError` unless ``rate`` parses as ``limits`` rate items
    (``20/second;600/minute``)."""
    from limits import parse_many

    try:
        if not parse_many(rate):
            raise ValueError("empty")
    except ValueError as exc:
        raise GatewayError(f"rate {rate!r}: use e.g. '20/second;600/minute' ({exc})") from exc
