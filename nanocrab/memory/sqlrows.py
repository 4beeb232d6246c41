"""Reading plain rows in one trip to the database.

SQLAlchemy's aiosqlite adapter runs a statement as four calls into aiosqlite's thread (open a
cursor, execute, fetch, close), and each call's answer waits for the event loop to come round.
On a busy loop (a run starting: every handler reacting at once) that made a one-row read of the
memory tables cost 2-13 ms. :func:`plain_rows` compiles the statement with the connection's
dialect and runs it with aiosqlite's ``execute_fetchall``: one call into the thread. Other
drivers (asyncpg has no thread) go through SQLAlchemy as usual.

Only for statements whose columns need no result processing (integers, strings, bytes): the
rows hold what the driver returns, as SQLAlchemy ``Row`` objects (attribute and ``_mapping``
access by column name); a failure is SQLAlchemy's :class:`~sqlalchemy.exc.DBAPIError`, as from
``conn.execute``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Select
from sqlalchemy.engine import Compiled, Dialect
from sqlalchemy.engine.result import result_tuple
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

_COMPILED: dict[tuple[int, str], tuple[Select[Any], Compiled, str, Any]] = {}
_COMPILED_MAX = 64


async def plain_rows(
    conn: AsyncConnection, stmt: Select[Any], params: Mapping[str, Any] | None = None
) -> Sequence[Any]:
    """The rows of ``stmt`` with its bound parameters set from ``params`` on ``conn`` (see the
    module docstring for what "plain" means).

    The compiled SQL is kept per statement object (and dialect): a caller reading often builds
    its statement once, with ``bindparam`` placeholders, and passes the values here; compiling a
    join of a few tables costs ~0.4 ms of the event loop each time otherwise."""
    if conn.dialect.driver != "aiosqlite":
        result = await (conn.execute(stmt, dict(params)) if params else conn.execute(stmt))
        return list(result.all())
    sql, positional, make = prepared(stmt, conn.dialect, params)
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None  # an open connection has its driver's
    try:
        fetched = await driver.execute_fetchall(sql, positional)
    except sqlite3.Error as exc:  # the error SQLAlchemy would have raised, as callers expect
        raise DBAPIError.instance(sql, positional, exc, sqlite3.Error) from exc
    return [make(row) for row in fetched]


def prepared(
    stmt: Select[Any], dialect: Dialect, params: Mapping[str, Any] | None = None
) -> tuple[str, list[Any], Callable[[Sequence[Any]], Any]]:
    """``stmt`` compiled for ``dialect`` (kept, see :func:`plain_rows`): its SQL, the
    positional values of ``params`` and what makes a fetched tuple a ``Row`` — for
    :func:`plain_rows`, or for a plain ``sqlite3`` connection in another thread (compile on the
    event loop, run the SQL there)."""
    key = (id(stmt), dialect.name)
    cached = _COMPILED.get(key)
    if cached is None or cached[0] is not stmt:
        fresh = stmt.compile(dialect=dialect)
        make = result_tuple([str(c.key) for c in stmt.selected_columns])
        cached = (stmt, fresh, str(fresh), make)
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = cached
    _, compiled, sql, make = cached
    values = compiled.construct_params(dict(params) if params else None) or {}
    positional = [values[name] for name in getattr(compiled, "positiontup", None) or ()]
    return sql, positional, make
