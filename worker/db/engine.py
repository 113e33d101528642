"""The async engine every Postgres user in memworker shares the settings of."""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from worker.settings import asyncpg_url


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def create_database_engine(database_url: str, *, pool: bool = True) -> AsyncEngine:
    """An asyncpg engine; ``postgresql://`` URLs are accepted as the contract promises.

    Connections are pinged on checkout, so after a Postgres restart the first query gets a
    fresh connection instead of a dead one. ``pool=False`` is for one-shot tools (migrate).
    """
    url = asyncpg_url(database_url)
    options: dict[str, Any] = {
        "json_serializer": _json_dumps,
        "json_deserializer": orjson.loads,
    }
    if pool:
        options.update(pool_pre_ping=True, pool_size=5, max_overflow=5)
    else:
        options["poolclass"] = NullPool
    return create_async_engine(url, **options)
