"""The audit filters' values as ``nanocrab audit`` reads them (the CLI's own copy lives in
nanocrab/cli/audit.py, which the gateway may not import)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``10m``, ``2h``, ``1d`` (before ``now``) or an ISO time (UTC when it has no offset), as
    an aware UTC datetime. Raises ``ValueError`` otherwise."""
    if m := _AGO.match(text):
        return (now or datetime.now(UTC)) - timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})
    value = datetime.fromisoformat(text.strip())
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
