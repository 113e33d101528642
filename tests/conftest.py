"""Fixtures every suite shares: real Redis and Postgres, each test isolated.

Redis isolation is by key prefix (``MEMWORKER_STREAM_PREFIX``): every key and stream a test
touches starts with its own ``t<hex>`` prefix and is deleted afterwards. Postgres isolation is
by database: each test that asks for ``database_url`` gets a fresh database, dropped afterwards.
The whole run has a HOME of its own (``tests.sealed_home``): beside a running ``memworker dev``
it neither picks up that dev's servers nor writes into the user's data.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from tests import servers
from tests.pgvector_server import pgvector_server
from tests.sealed_home import sealed
from worker.settings import Settings

_SEAL = contextlib.ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    """Seal HOME before any test module is imported (and so before any path is computed)."""
    _SEAL.enter_context(sealed())


def pytest_unconfigure(config: pytest.Config) -> None:
    _SEAL.close()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with servers.redis_server() as url:
        yield url
        forget_apply_function(url)


def forget_apply_function(url: str) -> None:
    """Delete the apply function's library the tests' workers loaded (functions are server-wide,
    not under a prefix). A worker elsewhere on this server using it loads it again itself."""
    import redis
    from redis.exceptions import ResponseError

    from worker.lifecycle.apply import APPLY

    client = redis.Redis.from_url(url)
    try:
        client.function_delete(APPLY.library)
    except (ResponseError, redis.ConnectionError):
        pass  # not loaded, or the server is gone already
    finally:
        client.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with servers.postgres_server() as url:
        yield Settings(database_url=url).database_url


@pytest.fixture(scope="session")
def pgvector_admin_url() -> Iterator[str]:
    """A server with pgvector (``tests.pgvector_server``), for the recall and role tests."""
    with pgvector_server() as url:
        yield Settings(database_url=url).database_url


@pytest.fixture
def prefix() -> str:
    return "t" + uuid.uuid4().hex[:12]


async def delete_prefixed(client: Redis, prefix: str) -> None:
    batch: list[bytes] = []
    async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            await client.unlink(*batch)
            batch.clear()
    if batch:
        await client.unlink(*batch)


@pytest.fixture
async def redis(redis_url: str, prefix: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        await client.ping()  # type: ignore[misc]
    except Exception as exc:
        await client.aclose()
        servers.unavailable("Redis", f"{redis_url} did not answer: {exc}")
    try:
        yield client
    finally:
        await delete_prefixed(client, prefix)
        await client.aclose()


@pytest.fixture
async def database_url(postgres_url: str) -> AsyncIterator[str]:
    """A fresh, empty database for this test; dropped when it ends."""
    name = "memworker_t" + uuid.uuid4().hex[:12]
    admin = create_async_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        await admin.dispose()
        servers.unavailable("PostgreSQL", f"could not create a test database: {exc}")
    url = make_url(postgres_url).set(database=name)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


@pytest.fixture
def settings(redis_url: str, prefix: str) -> Settings:
    return Settings(redis_url=redis_url, stream_prefix=prefix)
