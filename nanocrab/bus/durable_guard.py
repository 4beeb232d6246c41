"""Watching a handler's durable consumer for changes nobody in the runtime made.

Every identity may create server-named consumers (ordered feeds, replays, observers), through
``$JS.API.CONSUMER.CREATE.<stream>``, and the server reads the consumer's name from that
request's body: a request naming another handler's durable updates it. A subject permission
cannot tell (the name is not in the subject), and the clients' ordered consumers need that
subject. So a compromised identity can change a handler's filter (the handler then receives
nothing and stalls silently), ``headers_only`` (deliveries without their events), or its limits.

The guard makes that loud and short: it compares the durable's configuration with the one the
runtime made every ``interval_s``, and puts back what was changed (logged as an error). In the
test (``tests/test_broker_permissions.py``) a task stored while the filter was changed was
delivered once it was back. Preventing the change needs per-identity accounts, or client-named
ordered consumers and a deny list of durable names; docs/security.md says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.js.api import ConsumerConfig

log = logging.getLogger(__name__)

_SAFE_DEFAULTS: dict[str, Any] = {
    "headers_only": None, "inactive_threshold": None, "pause_until": None, "backoff": None,
    "max_batch": None, "max_expires": None, "max_bytes": None, "deliver_subject": None,
    "rate_limit_bps": None, "sample_freq": None,
}  # fmt: skip
"""Settings the runtime leaves unset and a tamperer could set: each would starve or cripple the
handler (no event data, a deletable durable, a paused one, one message per pull...)."""


def _normal(value: Any) -> Any:
    """A value as compared: empty and unset alike; filter lists in any order."""
    if value in (None, 0, False, "", [], {}):
        return None
    if isinstance(value, list):
        return sorted(map(str, value))
    return value


def _filters(config: dict[str, Any]) -> list[str]:
    many = config.get("filter_subjects") or []
    one = config.get("filter_subject")
    return sorted([*many, *([one] if one else [])])


def differences(expected: ConsumerConfig, actual: ConsumerConfig) -> list[str]:
    """The settings of ``actual`` that differ from ``expected`` (and from the runtime's unset
    defaults), as ``name: actual value``; empty when the durable is as the runtime made it."""
    want, have = expected.as_dict(), actual.as_dict()
    out = []
    # wider is what a newer version of the handler makes (a rolling upgrade runs both): only a
    # filter that lost some of this runtime's subjects is a change
    if set(_filters(want)) - set(_filters(have)):
        out.append(f"filter: {_filters(have)}")
    for key in ("ack_policy", "ack_wait", "max_deliver", "max_ack_pending", "max_waiting"):
        if key in want and _normal(want[key]) != _normal(have.get(key)):
            out.append(f"{key}: {have.get(key)!r}")
    for key in _SAFE_DEFAULTS:
        if key not in want and _normal(have.get(key)) is not None:
            out.append(f"{key}: {have.get(key)!r}")
    return out


_ERRORS = (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError)


class DurableGuard:
    """Checks durable ``name`` every ``interval_s`` and restores ``expected`` when it differs.

    ``restore`` re-applies the configuration (the runtime's own create-or-update). ``repaired``
    counts the restorations, for tests and metrics."""

    def __init__(
        self,
        js: Any,
        stream: str,
        name: str,
        expected: Callable[[], ConsumerConfig],
        restore: Callable[[], Awaitable[object]],
        *,
        interval_s: float = 2.0,
    ) -> None:
        self.js = js
        self.stream = stream
        self.name = name
        self.expected = expected
        self.restore = restore
        self.interval_s = interval_s
        self.repaired = 0

    async def check(self) -> list[str]:
        """One comparison (and restoration when needed); the differences it found."""
        try:
            info = await self.js.consumer_info(self.stream, self.name)
        except nats.js.errors.NotFoundError:
            log.error("handler %s: its durable consumer was deleted; creating it again",
                      self.name)  # fmt: skip
            await self.restore()
            self.repaired += 1
            return ["deleted"]
        changed = differences(self.expected(), info.config)
        if changed:
            log.error(
                "handler %s: its durable consumer was changed by someone else (%s); putting "
                "it back (docs/security.md: another identity can update a durable by name)",
                self.name, "; ".join(changed),
            )  # fmt: skip
            await self.restore()
            self.repaired += 1
        return changed

    async def watch(self, stopping: asyncio.Event) -> None:
        """Check until ``stopping`` is set; a failed check (a reconnect) waits for the next."""
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), self.interval_s)
                return
            except TimeoutError:
                pass
            try:
                await self.check()
            except _ERRORS as exc:
                log.debug("handler %s: durable check skipped: %r", self.name, exc)
