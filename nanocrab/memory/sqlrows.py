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
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select
from sqlalchemy.engine.result import result_tuple
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection


async def plain_rows(conn: AsyncConnection, stmt: Select[Any]) -> Sequence[Any]:
    """The rows of ``stmt`` on ``conn`` (see the module docstring for what "plain" means)."""
    if conn.dialect.driver != "aiosqlite":
        return list((await conn.execute(stmt)).all())
    compiled = stmt.compile(dialect=conn.dialect)
    params = compiled.construct_params()
    positional = [params[name] for name in compiled.positiontup or ()]
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None  # an open connection has its driver's
    sql = str(compiled)
    try:
        fetched = await driver.execute_fetchall(sql, positional)
    except sqlite3.Error as exc:  # the error SQLAlchemy would have raised, as callers expect
        raise DBAPIError.instance(sql, positional, exc, sqlite3.Error) from exc
    make = result_tuple([str(c.key) for c in stmt.selected_columns])
    return [make(row) for row in fetched]
