"""The memory package's one root exception."""

from __future__ import annotations


class NanocrabMemoryError(Exception):
    """Memory could not embed or store: the message says what to fix.

    (Not ``MemoryError``: that name is Python's out-of-memory error.)"""


class ModelNotFoundError(NanocrabMemoryError):
    """The embedding model's files are not installed where they were looked for."""


class DimensionError(NanocrabMemoryError):
    """A vector's dimension differs from the store's."""
