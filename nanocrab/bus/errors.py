"""The bus package's root exception and its typed failures."""

from __future__ import annotations


class BusError(Exception):
    """Root of every error raised by ``nanocrab.bus``."""


class ServerStartError(BusError):
    """The embedded nats-server could not be started or did not become ready."""


class AppendConflict(BusError):
    """An append's expected-last-sequence check failed: someone appended first.

    Nothing was stored. Reload the state (``actual`` hints where the log is, when known) and decide
    again.
    """

    def __init__(self, subject: str, expected: int, detail: str) -> None:
        super().__init__(
            f"expected last sequence {expected} on {subject!r} but the log moved on: {detail}"
        )
        self.subject = subject
        self.expected = expected
        self.detail = detail


class AppendRejected(BusError):
    """JetStream refused an append for a reason other than a sequence conflict (full, too big).

    ``code`` / ``err_code`` are JetStream's (HTTP-like status, JetStream error code; 0 when the
    refusal came without one): ``bus/failures.py`` tells a full log from a passing outage."""

    def __init__(self, message: str, *, code: int = 0, err_code: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code


class TransientError(BusError):
    """Raised by a reactor for a failure worth retrying later: the event is nak'd with backoff."""


class AuthenticationFailed(BusError):
    """The server refused the connection's credentials (unknown or missing nkey)."""


class PublishRefused(BusError):
    """The broker refused a publish: the identity may not publish on that subject (DESIGN §8).

    Nothing was stored. This is a wiring or security bug, not something to retry.
    """

    def __init__(self, identity: str | None, subject: str) -> None:
        who = f"identity {identity!r}" if identity else "this connection"
        super().__init__(
            f"the broker refused to let {who} publish on {subject!r} (permissions violation); "
            "see `nanocrab security nats-config` for what each identity may publish"
        )
        self.identity = identity
        self.subject = subject
