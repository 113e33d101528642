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


def is_connection_error(exc: BaseException) -> bool:
    """True for failures that say nothing about the data: the server is gone or going."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OSError | ConnectionError | TimeoutError)


async def storage_error(engine: AsyncEngine, timeout_s: float) -> Exception | None:
    """None when Postgres answers ``SELECT 1`` within ``timeout_s``, else why not."""
    try:
        async with asyncio.timeout(timeout_s), engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as exc:
        return exc
    return None
