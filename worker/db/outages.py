"""Telling a Postgres outage from a bad row: what the consolidator and the indexer ask of an error.

A write that fails because the server is gone says nothing about the data: nothing is
acknowledged and the loop backs off. Any other failure is the data's, and is isolated and
dead-lettered. ``storage_error`` asks the server (``SELECT 1``) when the error alone cannot say.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine


def first_line(exc: BaseException) -> str:
    """The first line of what went wrong (a DBAPIError's driver error, without SQL and link)."""
    text_ = str(exc.__cause__ or exc)
    return text_.splitlines()[0] if text_ else repr(exc)


SERVER_WIDE_CLASSES = ("08", "53", "57")
"""SQLSTATE classes of the server's condition, not the row's: connection exceptions, insufficient
resources (too many connections, disk full, out of memory), operator intervention (shutting
down, starting up: ``57P03``)."""
SERVER_WIDE_STATES = {
    "25006",  # read-only transaction: a failover left us on a replica
    "42501",  # insufficient privilege: a grant is missing, for every row alike
    "55P03",  # lock not available
    "40001",  # serialization failure
    "40P01",  # deadlock detected
}
"""Single SQLSTATEs that say nothing about the data either: retrying the same rows later works."""


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a Postgres error (the driver's, through SQLAlchemy), else None."""
    for candidate in (getattr(exc, "orig", None), exc.__cause__, exc):
        state = getattr(candidate, "sqlstate", None)
        if isinstance(state, str) and state:
            return state
    return None


DATA_ERROR_CLASSES = ("22", "54")
"""SQLSTATE classes that are the row's, never the server's: data exception (a NUL byte in text
``22021``/``22P05``, a value out of range, an invalid time) and program limit exceeded (a text
too long for an index, too many columns). The same row fails the same way every time."""


def is_data_error(exc: BaseException) -> bool:
    """True when Postgres refused the data itself (SQLSTATE class 22 or 54): retrying the same
    row can never succeed, so it is dead-lettered at once, not counted as a transient failure."""
    state = sqlstate(exc)
    return state is not None and state[:2] in DATA_ERROR_CLASSES


def is_connection_error(exc: BaseException) -> bool:
    """True for failures that say nothing about the data: the server is gone or going, or
    cannot take this write now (read-only after a failover, out of connections or disk, a
    missing grant): the loop holds the entries and backs off instead of dead-lettering them."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, OSError | ConnectionError | TimeoutError):
        return True
    state = sqlstate(exc)
    return state is not None and (state[:2] in SERVER_WIDE_CLASSES or state in SERVER_WIDE_STATES)


async def storage_error(engine: AsyncEngine, timeout_s: float) -> Exception | None:
    """None when Postgres answers ``SELECT 1`` within ``timeout_s``, else why not."""
    try:
        async with asyncio.timeout(timeout_s), engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as exc:
        return exc
    return None
