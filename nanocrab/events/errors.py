"""The events package's root exception and the typed decode failure."""

from __future__ import annotations

from enum import StrEnum


class EventError(Exception):
    """Root of every error raised by ``nanocrab.events``."""


class DecodeErrorKind(StrEnum):
    """Why bytes could not become an event; recorded verbatim in dead letters."""

    MALFORMED = "malformed"  # not JSON, or not a CloudEvents envelope
    UNKNOWN_TYPE = "unknown_type"  # a ``type`` this code base has no struct for
    INVALID = "invalid"  # envelope or data fails validation (missing field, wrong type)
    OVERSIZED = "oversized"  # larger than the codec's ``max_bytes``
    UNSUPPORTED_VERSION = "unsupported_version"  # schema newer than this code, or no upcaster


class EventDecodeError(EventError):
    """Raised by :meth:`Codec.decode`; ``kind`` says which rule failed, ``str()`` says how."""

    def __init__(self, kind: DecodeErrorKind, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class UpcastError(EventError):
    """A registered upcaster chain has a gap, or an upcaster failed."""
