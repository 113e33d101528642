"""Retention trims only what every group has acknowledged."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from worker.consumers.retention import trim_stream


async def test_trimming_keeps_pending_and_undelivered_entries(redis: Redis, prefix: str) -> None:
    stream = f"{prefix}:results:{{0}}"
    ids = [await redis.xadd(stream, {"n": str(i)}) for i in range(10)]
    await redis.xgroup_create(stream, "fast", id="0")
    await redis.xgroup_create(stream, "slow", id="0")
    await redis.xreadgroup("fast", "c", {stream: ">"})
    await redis.xack(stream, "fast", *ids)
    await redis.xreadgroup("slow", "c", {stream: ">"}, count=6)
    await redis.xack(stream, "slow", *ids[:3])  # 3, 4, 5 stay pending; 6..9 undelivered
    await asyncio.sleep(0.01)
    removed = await trim_stream(redis, stream, keep_seconds=0)
    assert removed == 3
    left: Any = await redis.xrange(stream)
    assert [i for i, _ in left] == ids[3:]


async def test_trimming_keeps_recent_entries_for_replay(redis: Redis, prefix: str) -> None:
    stream = f"{prefix}:lifecycle:{{0}}"
    ids = [await redis.xadd(stream, {"n": str(i)}) for i in range(5)]
    await redis.xgroup_create(stream, "g", id="0")
    await redis.xreadgroup("g", "c", {stream: ">"})
    await redis.xack(stream, "g", *ids)
    assert await trim_stream(redis, stream, keep_seconds=3600) == 0
    assert await redis.xlen(stream) == 5
    await asyncio.sleep(0.01)  # entries of the current millisecond are never trimmed
    assert await trim_stream(redis, stream, keep_seconds=0) == 5


async def test_a_stream_without_groups_is_trimmed_by_age_only(redis: Redis, prefix: str) -> None:
    stream = f"{prefix}:dlq:{{0}}"
    await redis.xadd(stream, {"n": "1"})
    assert await trim_stream(redis, stream, keep_seconds=3600) == 0
    assert await trim_stream(redis, f"{prefix}:missing", keep_seconds=0) == 0
