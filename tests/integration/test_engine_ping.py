"""The shared engine's checkout ping (``worker.db.engine``): a connection the server dropped is
replaced before a query uses it, and a live one costs one round trip to check, not three."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from worker.db.engine import create_database_engine


async def test_a_connection_the_server_dropped_is_replaced_at_checkout(database_url: str) -> None:
    engine = create_database_engine(database_url)
    admin = create_async_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            first = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        async with admin.connect() as conn:  # a restart, for this connection
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        async with engine.connect() as conn:  # no error: the pool replaced the dead one
            second = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        assert second != first
    finally:
        await engine.dispose()
        await admin.dispose()


async def test_checking_a_pooled_connection_out_costs_one_query(database_url: str) -> None:
    engine = create_database_engine(database_url)
    queries: list[str] = []

    def logged(record: Any) -> None:
        queries.append(record.query)

    try:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            assert raw.driver_connection is not None
            raw.driver_connection.add_query_logger(logged)
        for _ in range(3):
            queries.clear()
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 2"))
            await asyncio.sleep(0.05)  # the driver logs a query once it is answered
            # before the query's transaction, the ping: one round trip (SQLAlchemy's own
            # pool_pre_ping was three: BEGIN, ;, ROLLBACK)
            assert queries[: queries.index("BEGIN;")] == ["SELECT 1"], queries
    finally:
        await engine.dispose()
