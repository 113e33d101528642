"""The async engine every Postgres user in memworker shares the settings of."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from weakref import WeakKeyDictionary

import orjson
from sqlalchemy import Engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, NullPool, PoolProxiedConnection, QueuePool
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


Begin = Callable[[], AbstractAsyncContextManager[AsyncConnection]]
"""A second connection's transaction, as ``AsyncEngine.begin`` gives one."""


class SecondConnections:
    """Whether a caller that holds a connection of ``engine`` may take a second one beside it
    (a recall's meaning half on its own connection while its words half reads: BENCHMARKS.md,
    the memory inspector).

    Holding one connection while waiting for another is how a pool deadlocks: with as many
    such callers as the pool has connections, each holds one and all wait. So at most half the
    pool's connections' worth of callers take a second one at a time; a caller that finds no
    slot free goes on with the one it holds (the halves in turn), never waiting. A pool of
    fewer than two connections, or one that shares a single connection, gives no second. One
    per engine (``of``): every user of the engine counts against the same slots."""

    @classmethod
    def of(cls, engine: AsyncEngine) -> SecondConnections:
        found = _SECOND.get(engine.sync_engine)
        if found is None:
            found = _SECOND[engine.sync_engine] = cls(engine)
        return found

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        pool = engine.pool
        slots = 0
        if isinstance(pool, QueuePool):
            overflow = max(0, pool._max_overflow)  # -1: no bound, counted as none
            slots = (pool.size() + overflow) // 2
        elif isinstance(pool, NullPool):  # a connection each: only the server bounds them
            slots = 4
        self._slots = asyncio.Semaphore(slots) if slots > 0 else None

    @asynccontextmanager
    async def maybe(self) -> AsyncIterator[Begin | None]:
        """A second connection's ``begin`` while a slot is free, else None (never waits)."""
        if self._slots is None or self._slots.locked():
            yield None
            return
        await self._slots.acquire()  # free: taken at once, no await in between
        try:
            yield self._engine.begin
        finally:
            self._slots.release()


_SECOND: WeakKeyDictionary[Engine, SecondConnections] = WeakKeyDictionary()
