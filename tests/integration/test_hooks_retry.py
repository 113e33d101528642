"""How long LifecycleHooks retries a hook that raises, against real Redis: the retry window
(``MEMWORKER_HOOK_RETRY_SECONDS``), then the dead letter."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.asyncio import Redis

from tests.helpers import wait_until
from tests.integration.results_factory import base_result, publish
from worker import LifecycleEvent, LifecycleHooks
from worker.keys import StreamKeys
from worker.settings import Settings


async def serve_until(hooks: LifecycleHooks, settings: Settings, redis: Redis, done: Any) -> None:
    stop = asyncio.Event()
    serving = asyncio.create_task(
        hooks.serve("retrying", from_start=True, stop=stop, redis=redis, settings=settings)
    )
    try:
        await wait_until(done, timeout=60)
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)


async def test_by_default_a_hook_failing_for_a_few_seconds_still_runs_and_nothing_is_dead_lettered(
    redis: Redis, settings: Settings
) -> None:
    assert settings.hook_retry_seconds >= 10  # a downstream service restarting, a short outage
    hooks = LifecycleHooks()
    calls: list[float] = []
    succeeded = asyncio.Event()

    @hooks.on_spawn
    def flaky(event: LifecycleEvent) -> None:
        calls.append(time.monotonic())
        if calls[-1] - calls[0] < 3.0:  # the service it calls is down for 3 s
            raise RuntimeError("webhook answered 503")
        succeeded.set()

    await publish(redis, settings, [base_result("agent.spawned", "p", "s1", initial_items=1)])

    async def ran() -> bool:
        return succeeded.is_set()

    await serve_until(hooks, settings, redis, ran)
    assert await redis.xlen(StreamKeys(settings.stream_prefix, 0).dlq) == 0
    assert len(calls) > settings.max_deliveries  # retried past the delivery count, by time


async def test_a_hook_that_keeps_raising_is_retried_for_the_window_then_dead_lettered(
    redis: Redis, redis_url: str, prefix: str
) -> None:
    settings = Settings(redis_url=redis_url, stream_prefix=prefix, hook_retry_seconds=2.5)
    hooks = LifecycleHooks()
    calls: list[float] = []

    @hooks.on_spawn
    def broken(event: LifecycleEvent) -> None:
        calls.append(time.monotonic())
        raise RuntimeError("always")

    await publish(redis, settings, [base_result("agent.spawned", "p", "s1", initial_items=1)])
    dlq = StreamKeys(prefix, 0).dlq

    async def dead_lettered() -> bool:
        return bool(await redis.xlen(dlq))

    await serve_until(hooks, settings, redis, dead_lettered)
    assert calls[-1] - calls[0] >= 2.5
    assert len(calls) >= settings.max_deliveries
    rows: Any = await redis.xrange(dlq)
    ((_id, letter),) = rows
    assert letter[b"reason"] == b"hook_failed"
    assert b"RuntimeError: always" in letter[b"error"]
