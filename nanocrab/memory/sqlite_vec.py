"""Makes the ``sqlite-vec`` extension available to every SQLite connection this process opens.

Python builds without ``--enable-loadable-sqlite-extensions`` (pyenv's default, the one this
project's venv uses here) have no ``Connection.enable_load_extension``, and aiosqlite hides the
connection anyway. SQLite's own ``sqlite3_auto_extension`` needs neither: it registers
``sqlite3_vec_init`` (from the ``sqlite-vec`` wheel's shared library) to run on every connection
opened afterwards, by the stdlib ``sqlite3`` module, aiosqlite and SQLAlchemy alike. Connections
opened before :func:`register` do not have it.
"""

from __future__ import annotations

import ctypes
import logging
import threading

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: bool | None = None
_keep: list[ctypes.CDLL] = []  # the loaded extension library must outlive every connection


def register() -> bool:
    """Register sqlite-vec for new connections (once per process); False when it cannot be
    (the package is missing, or this sqlite3 module does not expose SQLite's C API)."""
    global _state
    with _lock:
        if _state is not None:
            return _state
        _state = _register()
        return _state


def _register() -> bool:
    try:
        import _sqlite3

        import sqlite_vec
    except ImportError as exc:
        log.warning("sqlite-vec unavailable (%s): memory search is exact, in numpy", exc)
        return False
    try:
        # the symbol lookup on the module's handle also searches the libsqlite3 it links to
        sqlite = ctypes.CDLL(_sqlite3.__file__)
        auto_extension = sqlite.sqlite3_auto_extension
        vec = ctypes.CDLL(f"{sqlite_vec.loadable_path()}.so")
        entry = ctypes.cast(vec.sqlite3_vec_init, ctypes.c_void_p)
    except (OSError, AttributeError) as exc:
        log.warning("cannot register sqlite-vec (%s): memory search is exact, in numpy", exc)
        return False
    auto_extension.argtypes = [ctypes.c_void_p]
    auto_extension.restype = ctypes.c_int
    if auto_extension(entry) != 0:
        log.warning("sqlite3_auto_extension refused sqlite-vec: memory search is exact, in numpy")
        return False
    _keep.append(vec)
    return True
