"""The front door: an HTTP, SSE and WebSocket gateway with API tokens, scopes and rate limits,
and the web view it serves (docs/gateway.md).

Beside the handlers: imports events, bus, projections and security, never handlers or cli.
"""

from nanocrab.gateway.errors import GatewayError, Problem
from nanocrab.gateway.tokens import SCOPES, Scope, Token, TokenStore

__all__ = ["SCOPES", "GatewayError", "Problem", "Scope", "Token", "TokenStore"]
