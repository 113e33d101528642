"""A lifecycle entry XADDed with an explicit id far ahead of the clock (``XADD key
9999999999999-0 …``, which any user allowed XADD may send): it is dead-lettered ``future_id``,
the auto-id commands after it (which Redis gives the same time) are applied, and retention still
trims the stream once every group consumed it, instead of keeping those entries for good."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from tests.helpers import running_worker
from worker.keys import StreamKeys, shard_of
from worker.lifecycle.client import LifecycleClient
from worker.ops.inspection import stream_stats
from worker.settings import Settings

FUTURE = "9999999999999-0"


async def test_an_explicit_future_id_is_dead_lettered_and_later_commands_applied_and_trimmed(
    redis: Redis, settings: Settings
) -> None:
    settings = settings.model_copy(update={"shards": 1, "retention_interval_seconds": 3600.0})
    streams = StreamKeys(settings.stream_prefix, shard_of("fp", "after1", 1))
    publisher = LifecycleClient(settings=settings)
    try:
        async with running_worker(settings) as worker:
            before = await publisher.wait(
                await publisher.spawn("fp", "before1", "carl", {"email": "carl-before@x.example"})
            )
            assert before.type == "agent.spawned"
            await redis.xadd(streams.lifecycle, {"data": b'{"junk":1}'}, id=FUTURE)
            spawned = await publisher.wait(
                await publisher.spawn("fp", "after1", "carl", {"email": "carl-after@x.example"})
            )
            assert spawned.type == "agent.spawned", spawned
            ended = await publisher.wait(await publisher.terminate("fp", "after1", "carl"))
            assert ended.type == "agent.terminated", ended

            letters: Any = await redis.xrange(streams.dlq)
            assert len(letters) == 1
            letter = {k.decode(): v.decode() for k, v in letters[0][1].items()}
            assert letter["source_id"] == FUTURE
            assert letter["reason"] == "future_id"
            assert "ahead of the server's clock" in letter["error"]

            # stats shows the stream ahead of the clock
            rows = await stream_stats(redis, settings)
            row = next(r for r in rows if r.stream == streams.lifecycle)
            assert row.ahead_seconds is not None and row.ahead_seconds > 10**9

            # Retention: the future entries go once consumed for the retention period,
            # measured from when they were seen consumed (their ids' time never comes).
            assert await redis.xlen(streams.lifecycle) == 4
            await worker.trim_once(keep_seconds=1.0)
            kept: Any = await redis.xrange(streams.lifecycle, min=FUTURE)
            assert len(kept) == 3  # consumed, but seen so for less than 1 s
            await asyncio.sleep(1.2)
            await worker.trim_once(keep_seconds=1.0)
            assert await redis.xlen(streams.lifecycle) == 0
    finally:
        await publisher.close()


async def test_entries_trimmed_by_an_xadd_maxlen_before_the_worker_read_them_are_reported(
    redis: Redis, settings: Settings
) -> None:
    """No ACL can forbid ``XADD key MAXLEN 1 * …`` to a user allowed XADD: what was removed
    unread shows in ``memworker stats`` and in the worker's gauges, and the ids ahead too."""
    from prometheus_client import REGISTRY

    from worker.consumers.groups import ensure_group
    from worker.consumers.lag import probe_group_lag
    from worker.keys import LIFECYCLE_GROUP

    stream = StreamKeys(settings.stream_prefix, 0).lifecycle
    await ensure_group(redis, stream, LIFECYCLE_GROUP)
    for n in range(3):
        await redis.xadd(stream, {"data": str(n).encode()})
    await redis.xreadgroup(LIFECYCLE_GROUP, "c", {stream: ">"}, count=1)  # one read
    quiet = await stream_stats(redis, settings)
    assert not any(r.removed_unread for r in quiet)
    await redis.xadd(stream, {"data": b"x"}, maxlen=1, approximate=False)  # drops 2 unread

    rows = await stream_stats(redis, settings)
    row = next(r for r in rows if r.stream == stream and r.group == LIFECYCLE_GROUP)
    assert row.removed_unread and row.ahead_seconds is None
    await probe_group_lag(redis, LIFECYCLE_GROUP, [stream])
    labels = {"stream": stream, "group": LIFECYCLE_GROUP}
    assert REGISTRY.get_sample_value("memworker_stream_removed_unread", labels) == 1.0
    assert REGISTRY.get_sample_value("memworker_stream_ids_ahead_seconds", {"stream": stream}) == 0

    await redis.xadd(stream, {"data": b"junk"}, id=FUTURE)
    await probe_group_lag(redis, LIFECYCLE_GROUP, [stream])
    ahead = REGISTRY.get_sample_value("memworker_stream_ids_ahead_seconds", {"stream": stream})
    assert ahead is not None and ahead > 10**9
