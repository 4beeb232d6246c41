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

The cookie is sent by the browser whatever page asks, and ``SameSite`` does not tell ports
apart: a page on another port of the same host is "same-site". So a request that authenticates
with the cookie and changes something (any method but GET/HEAD/OPTIONS), and every WebSocket
upgrade using the cookie, must come from the gateway's own pages (:func:`same_origin`), or it is
refused with 403 before anything else is read. A bearer token or ``?token=`` is not something
another page can make the browser send, so those requests are not checked.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

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


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing: a cookie may authenticate them from any page (and another
origin cannot read the answer: the gateway sends no CORS headers)."""


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether the browser says the request comes from the gateway's own pages: its
    ``Sec-Fetch-Site`` is ``same-origin`` (or ``none``: typed in the address bar), and its
    ``Origin``, when sent, is the ``Host`` it was sent to (scheme aside; the port counts). A
    client sending neither header is not a browser, and no other page made it send the cookie.
    Behind a reverse proxy, pass the ``Host`` header through."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is None:
        return True
    netloc = urlsplit(origin).netloc.lower()
    return bool(netloc) and netloc == (headers.get("host") or "").lower()


def cross_site(headers: Mapping[str, str]) -> Problem:
    """The refusal of a cookie-authenticated request another page made."""
    return Problem(
        403, "cross-site", "Cross-site request refused",
        f"the web view's cookie authenticates only requests from the gateway's own pages "
        f"(Origin {headers.get('origin')!r}, Sec-Fetch-Site {headers.get('sec-fetch-site')!r}, "
        f"Host {headers.get('host')!r}); a client of its own sends 'Authorization: Bearer "
        "<token>'",
    )  # fmt: skip
