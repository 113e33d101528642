"""A silent partition: the network swallows packets, no reset, no reply. The worker must say it
is not ready while it lasts and finish the work, exactly once, when it heals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from tests.faults.support import (
    FaultProxy,
    assert_exactly_once,
    audit,
    ensure_groups,
    lifecycle_order,
    pending,
    publish_many,
    wait_for_results,
)
from tests.helpers import running_worker, wait_until
from worker.settings import Settings

pytestmark = pytest.mark.faults


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[FaultProxy]:
    target = urlsplit(redis_url)
    proxy = FaultProxy(target.hostname or "127.0.0.1", target.port or 6379)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_overdue_replies_make_the_worker_not_ready_and_nothing_is_lost_after_healing(
    redis: Redis, settings: Settings, proxy: FaultProxy
) -> None:
    fast = settings.model_copy(
        update={"reply_timeout_seconds": 0.5, "reclaim_idle_ms": 1000, "reclaim_interval_ms": 200}
    )
    path = urlsplit(fast.redis_url).path or "/0"
    behind = fast.model_copy(update={"redis_url": f"redis://{proxy.address}{path}"})
    await ensure_groups(redis, fast)
    bodies = lifecycle_order(300)
    async with running_worker(behind, consumer="partitioned") as worker:
        await publish_many(redis, fast, bodies[:600])
        await wait_for_results(redis, fast, 600, timeout=30)
        proxy.stall = True  # packets vanish; connections stay open, nothing is reset
        await publish_many(redis, fast, bodies[600:])

        async def not_ready() -> bool:
            return not worker.ready

        await wait_until(not_ready, timeout=20)
        proxy.heal()
        await wait_for_results(redis, fast, len(bodies), timeout=60)
        while await pending(redis, fast):
            await asyncio.sleep(0.1)

        async def ready() -> bool:
            return worker.ready

        await wait_until(ready, timeout=20)
    report = await audit(redis, fast)
    assert_exactly_once(report, [b["event_id"] for b in bodies])
