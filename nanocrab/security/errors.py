"""Security errors that are a configuration or key problem (not a refused call: those are data)."""

from __future__ import annotations


class SecurityError(Exception):
    """Base for security set-up errors; messages say what to do next."""


class KeyFileError(SecurityError):
    """A key file is missing, malformed or too widely readable."""
