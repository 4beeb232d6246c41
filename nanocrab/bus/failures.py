"""Which bus failures pass by themselves and which need an operator.

*Transient*: the server or connection is away or busy (no responders, service unavailable,
timeouts, a dropped connection, a consumer to re-create) — retrying is the fix. *Permanent*: the
log is full, a stream is missing, the account is out of resources, a configuration is refused —
retrying alone never helps; someone has to act (raise ``log_max_bytes``, set the bus up, fix the
config), so it is logged at ERROR and shown by ``nanocrab status``.
"""

from __future__ import annotations

from typing import Literal

import nats.errors
import nats.js.errors

from nanocrab.bus.errors import AppendRejected

Severity = Literal["transient", "permanent"]

STREAM_NOT_FOUND = 10059
INSUFFICIENT_RESOURCES = 10023
STORE_FAILED = 10077
"""The store refused the message: "maximum messages exceeded" / "maximum bytes exceeded" on a
full stream that discards new messages."""
INVALID_STREAM_CONFIG = 10052
MESSAGE_TOO_BIG = 10054
PERMANENT_CODES = frozenset(
    {STREAM_NOT_FOUND, INSUFFICIENT_RESOURCES, STORE_FAILED, INVALID_STREAM_CONFIG, MESSAGE_TOO_BIG}
)
CONSUMER_NOT_FOUND = 10014
"""Transient for a handler: it re-creates its consumer on the next attempt."""


def severity(exc: BaseException) -> Severity:
    """Classify a failure of the bus (a JetStream API error, an append JetStream refused, a
    connection error). Anything not known to be permanent is transient."""
    if isinstance(exc, AppendRejected):
        return _by_code(exc.code, exc.err_code)
    if isinstance(exc, nats.js.errors.ServiceUnavailableError | nats.errors.NoRespondersError):
        return "transient"
    if isinstance(exc, nats.js.errors.APIError):
        return _by_code(exc.code or 0, exc.err_code or 0)
    return "transient"


def _by_code(code: int, err_code: int) -> Severity:
    if err_code in PERMANENT_CODES:
        return "permanent"
    if err_code == CONSUMER_NOT_FOUND or code == 503:
        return "transient"
    if code == 400:  # a request the server will refuse again: a bad configuration
        return "permanent"
    return "transient"
