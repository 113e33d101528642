"""The async engine every Postgres user in memworker shares the settings of."""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, NullPool, PoolProxiedConnection
from sqlalchemy.util.concurrency import await_

from worker.settings import asyncpg_url


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def create_database_engine(database_url: str, *, pool: bool = True) -> AsyncEngine:
    """An asyncpg engine; ``postgresql://`` URLs are accepted as the contract promises.

    Connections are pinged on checkout (``_ping``), so after a Postgres restart the first query
    gets a fresh connection instead of a dead one. ``pool=False`` is for one-shot tools
    (migrate).
    """
    url = asyncpg_url(database_url)
    options: dict[str, Any] = {
        "json_serializer": _json_dumps,
        "json_deserializer": orjson.loads,
    }
    if pool:
        options.update(pool_size=5, max_overflow=5)
    else:
        options["poolclass"] = NullPool
    engine = create_async_engine(url, **options)
    if pool:
        event.listen(engine.sync_engine, "checkout", _ping)
    return engine


def _ping(
    _dbapi_connection: Any, record: ConnectionPoolEntry, _proxy: PoolProxiedConnection
) -> None:
    """A checked-out connection answers ``SELECT 1`` (one round trip), or the pool replaces
    it (``DisconnectionError``: a fresh connection, up to three attempts). SQLAlchemy's own
    ``pool_pre_ping`` wraps its ping in a transaction on asyncpg: three round trips, a third of
    a recall's (BENCHMARKS.md, LoCoMo). A query without arguments (the simple protocol) prepares
    nothing, so it is safe behind a pooler in transaction mode too."""
    connection = record.driver_connection
    try:
        if connection is None:
            raise ConnectionError("no driver connection")
        await_(connection.execute("SELECT 1"))
    except Exception as exc:  # a dead or broken connection, whatever the driver says
        raise DisconnectionError(f"the connection did not answer a ping: {exc}") from exc
