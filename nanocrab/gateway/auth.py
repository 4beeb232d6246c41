"""Who is calling and how often: bearer tokens (or the web view's cookie) and per-token rates.

A request presents its token as ``Authorization: Bearer ncg_…``, as the ``nanocrab_token``
cookie (the web view, set by its login form; ``SameSite=Strict``, ``HttpOnly``), or — for
WebSockets only, which browsers cannot give headers — as ``?token=``. Missing or unknown tokens
are 401, a token without the scope an endpoint needs is 403, a token over its rate is 429 with
``Retry-After``. Rates are the token's own (``limits`` rate strings), counted in this gateway
process's memory with ``limits``' sliding-window counter: O(1) per request whatever the rate
(its moving window keeps one timestamp per allowed request, and its synchronous memory storage
starts a timer thread per request — both measurable on the hot path, bench/gateway.py).

A verified token is remembered for :data:`VERIFIED_TTL_S`, so a revocation takes effect within
that time rather than at once; the store is not read on every request.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from limits import RateLimitItem, parse_many
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import SlidingWindowCounterRateLimiter

from nanocrab.gateway.errors import Problem
from nanocrab.gateway.tokens import Scope, Token, TokenStore

COOKIE = "nanocrab_token"
VERIFIED_TTL_S = 1.0
"""How long a verified token is trusted without reading the store again (revocation delay)."""


def unauthorized(detail: str) -> Problem:
    return Problem(
        401, "unauthorized", "Missing or invalid API token", detail,
        headers={"WWW-Authenticate": 'Bearer realm="nanocrab"'},
    )  # fmt: skip


@dataclass
class Authenticator:
    """Checks tokens against ``store`` and counts each token's requests."""

    store: TokenStore
    limiter: SlidingWindowCounterRateLimiter = field(
        default_factory=lambda: SlidingWindowCounterRateLimiter(MemoryStorage())
    )
    _rates: dict[str, list[RateLimitItem]] = field(default_factory=dict)
    _verified: dict[str, tuple[float, Token]] = field(default_factory=dict)

    def token(self, presented: str | None) -> Token:
        if not presented:
            raise unauthorized(
                "send 'Authorization: Bearer <token>' (create one with "
                "`nanocrab gateway token create`)"
            )
        now = time.monotonic()
        known = self._verified.get(presented)
        if known is not None and now - known[0] < VERIFIED_TTL_S:
            return known[1]
        token = self.store.verify(presented)
        if token is None:
            self._verified.pop(presented, None)
            raise unauthorized("the token is unknown, malformed or revoked")
        if len(self._verified) > 10_000:  # bounded: only live tokens' secrets are kept
            self._verified.clear()
        self._verified[presented] = (now, token)
        return token

    async def check(self, token: Token, scope: Scope) -> Token:
        """``token`` if it holds ``scope`` and is under its rate; else the refusal."""
        if not token.allows(scope):
            raise Problem(
                403, "forbidden", "The token lacks the scope this needs",
                f"this needs the {scope!r} scope; the token has {', '.join(token.scopes)}",
            )  # fmt: skip
        rates = self._rates.get(token.rate)
        if rates is None:
            rates = self._rates[token.rate] = parse_many(token.rate)
        for rate in rates:
            if not await self.limiter.hit(rate, token.id):
                reset = (await self.limiter.get_window_stats(rate, token.id)).reset_time
                wait = max(1, math.ceil(reset - time.time()))
                raise Problem(
                    429, "rate-limited", "Too many requests for this token",
                    f"over {rate} for this token; retry in {wait}s",
                    headers={"Retry-After": str(wait)},
                )  # fmt: skip
        return token


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None
