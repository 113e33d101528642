"""Which Postgres errors are the server's condition (held and retried) and which are the row's
(isolated and dead-lettered): real errors from a real server."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.engine import create_database_engine
from worker.db.outages import is_connection_error


async def error_of(engine: AsyncEngine, *statements: str) -> BaseException:
    """What the server answered to ``statements`` in one transaction (it must refuse them)."""
    try:
        async with engine.begin() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    except DBAPIError as exc:
        return exc
    raise AssertionError(f"the server accepted {statements}")


async def test_a_read_only_server_or_a_missing_grant_is_held_and_a_bad_row_is_not(
    database_url: str,
) -> None:
    engine = create_database_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE outage_probe (id int PRIMARY KEY)"))
            await conn.execute(text("INSERT INTO outage_probe VALUES (1)"))
            await conn.execute(text("DROP ROLE IF EXISTS outage_probe_reader"))
            await conn.execute(text("CREATE ROLE outage_probe_reader"))
        # a failover to a replica: every write refused alike (SQLSTATE 25006)
        read_only = await error_of(
            engine, "SET TRANSACTION READ ONLY", "INSERT INTO outage_probe VALUES (2)"
        )
        assert is_connection_error(read_only)
        # the runtime role without its grant: every row alike (42501)
        no_grant = await error_of(
            engine, "SET LOCAL ROLE outage_probe_reader", "INSERT INTO outage_probe VALUES (3)"
        )
        assert is_connection_error(no_grant)
        # the row's own fault: a duplicate key, a value of the wrong type
        assert not is_connection_error(
            await error_of(engine, "INSERT INTO outage_probe VALUES (1)")
        )
        bad = await error_of(engine, "INSERT INTO outage_probe VALUES ('not a number')")
        assert not is_connection_error(bad)
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TABLE IF EXISTS outage_probe"))
            await conn.execute(text("DROP ROLE IF EXISTS outage_probe_reader"))
        await engine.dispose()
