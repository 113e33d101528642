"""Many calls at once from one process: each waits for a free connection of its client's
pool (``MEMWORKER_REDIS_MAX_CONNECTIONS``) instead of failing, and a pool that stays full
says so, naming the setting, without blaming Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.redis_process import RedisProcess
from worker.keys import StreamKeys
from worker.lifecycle.client import LifecycleClient
from worker.memory import WorkingMemory
from worker.redis_conditions import RedisConditionError
from worker.settings import Settings

CALLS = 300


async def test_300_concurrent_working_memory_calls_all_succeed(
    redis: Redis, settings: Settings
) -> None:
    async with await WorkingMemory.for_session("s1", "p", settings=settings) as memory:
        await asyncio.gather(*(memory.set(f"k{i}", i) for i in range(CALLS)))
        values = await asyncio.gather(*(memory.get(f"k{i}") for i in range(CALLS)))
    assert values == list(range(CALLS))


async def test_300_concurrent_spawns_all_succeed(redis: Redis, settings: Settings) -> None:
    async with LifecycleClient(settings=settings) as client:
        sent = await asyncio.gather(*(client.spawn("p", f"s{i}", "a") for i in range(CALLS)))
    assert len(set(sent)) == CALLS
    assert await redis.xlen(StreamKeys(settings.stream_prefix, 0).lifecycle) == CALLS


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path, persistent=False)
    server.start()
    yield server
    server.stop()


async def test_a_client_opens_no_more_connections_than_the_setting(
    own_redis: RedisProcess, prefix: str
) -> None:
    settings = Settings(redis_url=own_redis.url, stream_prefix=prefix, redis_max_connections=4)
    probe = Redis.from_url(own_redis.url)
    before: Any = await probe.info("stats")
    async with await WorkingMemory.for_session("s1", "p", settings=settings) as memory:
        await asyncio.gather(*(memory.append_scratchpad(f"note {i}") for i in range(CALLS)))
        assert len(await memory.get_scratchpad()) == CALLS
    after: Any = await probe.info("stats")
    await probe.aclose()
    opened = after["total_connections_received"] - before["total_connections_received"]
    assert opened <= 4


async def test_a_pool_that_stays_full_names_the_setting(redis: Redis, settings: Settings) -> None:
    narrow = settings.model_copy(
        update={"redis_max_connections": 1, "redis_pool_timeout_seconds": 0.3}
    )
    async with LifecycleClient(settings=narrow) as client:
        stream = StreamKeys(settings.stream_prefix, 0).results
        read: Any = client.redis.xread({stream: "$"}, block=2000)
        held = asyncio.ensure_future(read)
        await asyncio.sleep(0.1)  # the one connection is taken by the blocking read
        with pytest.raises(RedisConditionError) as caught:
            await client.spawn("p", "s1", "a")
        await held
    message = str(caught.value)
    assert "MEMWORKER_REDIS_MAX_CONNECTIONS" in message
    assert "unreachable" not in message and "\n" not in message
