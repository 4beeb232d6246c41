"""The gateway's one root exception and the problem it answers with (RFC 9457 problem+json)."""

from __future__ import annotations


class GatewayError(Exception):
    """Root of the gateway's errors (bad configuration, an unusable token store)."""


class Problem(GatewayError):
    """A request the gateway refuses: rendered as ``application/problem+json`` with ``status``.

    ``kind`` becomes the problem ``type`` (``/problems/<kind>``, documented in docs/gateway.md),
    ``title`` is fixed per kind, ``detail`` says what was wrong with this request."""

    def __init__(
        self,
        status: int,
        kind: str,
        title: str,
        detail: str = "",
        *,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {kind}: {detail or title}")
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.headers = headers or {}

    def body(self, instance: str = "") -> dict[str, object]:
        body: dict[str, object] = {
            "type": f"/problems/{self.kind}",
            "title": self.title,
            "status": self.status,
        }
        if self.detail:
            body["detail"] = self.detail
        if instance:
            body["instance"] = instance
        return body


def not_found(what: str, ident: str) -> Problem:
    return Problem(404, "not-found", f"No such {what}", f"no {what} {ident!r} for this tenant")


def conflict(detail: str) -> Problem:
    return Problem(409, "conflict", "Conflict with the current state", detail)
