"""Network faults between a worker and Redis: a TCP proxy in the test delays, drops, resets,
stalls and refuses the worker's connections while commands stream in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from tests.faults.support import (
    FaultProxy,
    assert_exactly_once,
    audit,
    ensure_groups,
    figures,
    lifecycle_order,
    pending,
    publish_many,
    states,
    wait_for_results,
)
from tests.helpers import running_worker, wait_until
from worker.settings import Settings

pytestmark = pytest.mark.faults

SESSIONS = 2_000  # x 4 = 8,000 commands


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[FaultProxy]:
    target = urlsplit(redis_url)
    proxy = FaultProxy(target.hostname or "127.0.0.1", target.port or 6379)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


def ready(worker: Any) -> Any:
    async def check() -> bool:
        return bool(worker.ready)

    return check


def through(settings: Settings, proxy: FaultProxy) -> Settings:
    path = urlsplit(settings.redis_url).path or "/0"
    return settings.model_copy(update={"redis_url": f"redis://{proxy.address}{path}"})


async def test_delays_drops_resets_and_stalls_lose_and_double_nothing_once_the_network_heals(
    redis: Redis, settings: Settings, proxy: FaultProxy
) -> None:
    fast = settings.model_copy(
        update={"reclaim_idle_ms": 1000, "reclaim_interval_ms": 200, "seq_retry_ms": 50}
    )
    await ensure_groups(redis, fast)
    bodies = lifecycle_order(SESSIONS)
    readiness: list[bool] = []
    faults: list[tuple[float, str]] = []

    async def stream_commands() -> None:
        for i in range(0, len(bodies), 400):
            await publish_many(redis, fast, bodies[i : i + 400])
            await asyncio.sleep(0.5)

    async def inject(worker: Any) -> None:
        """About ten seconds of trouble on the faulted worker's connections."""

        async def step(name: str, seconds: float) -> None:
            faults.append((time.monotonic(), name))
            await asyncio.sleep(seconds)

        proxy.delay = 0.2
        await step("delay 200 ms", 2.0)
        proxy.delay = 0.0
        proxy.drop()
        await step("drop (FIN) every connection", 1.0)
        proxy.reset()
        await step("reset (RST) every connection", 1.0)
        proxy.stall = True
        await step("stall 1.5 s (longer than the reclaim idle time)", 1.5)
        proxy.reset()
        proxy.stall = False
        await step("reset the stalled connections", 0.5)
        proxy.refuse = True
        proxy.reset()
        await step("refuse new connections for 1.5 s", 1.5)
        proxy.refuse = False
        proxy.delay = 0.05
        proxy.drop()
        await step("delay 50 ms after a drop", 1.0)
        proxy.heal()

    started = time.monotonic()
    # One worker behind the faulty proxy, one connected directly: the healthy one reclaims
    # what the faulted one leaves pending, and the faulted one must rejoin by itself.
    async with (
        running_worker(through(fast, proxy), consumer="faulted") as faulted,
        running_worker(fast, consumer="direct"),
    ):

        async def watch() -> None:
            while True:
                if not readiness or readiness[-1] != faulted.ready:
                    readiness.append(faulted.ready)
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        publisher = asyncio.create_task(stream_commands())
        await asyncio.sleep(0.5)
        await inject(faulted)
        healed_at = time.monotonic()
        await publisher
        await wait_for_results(redis, fast, len(bodies), timeout=120)
        while await pending(redis, fast):
            await asyncio.sleep(0.1)
        settled = time.monotonic() - healed_at
        # Once the network heals the faulted worker reports ready again by itself (within its
        # reconnect backoff, at most 5 s), with or without new commands to apply.
        await wait_until(ready(faulted), timeout=10)
        ready_after_heal = time.monotonic() - healed_at
        watcher.cancel()
    report = await audit(redis, fast)
    event_ids = [b["event_id"] for b in bodies]
    assert_exactly_once(report, event_ids)
    assert report.rejected == []
    assert report.dead == []
    assert await states(redis, fast, [f"s{n}" for n in range(SESSIONS)]) == {"terminated": SESSIONS}
    assert False in readiness, "the faulted worker reported not-ready during the outage"
    figures(
        "network_faults",
        commands=len(bodies),
        faults=[name for _t, name in faults],
        connections_hit=dict(proxy.faults),
        lost=len(report.missing(event_ids)),
        duplicated=report.duplicated,
        all_done_after_heal_s=round(settled, 2),
        ready_after_heal_s=round(ready_after_heal, 2),
        elapsed_s=round(time.monotonic() - started, 1),
    )


async def test_a_worker_behind_a_broken_network_rejoins_alone_and_finishes_the_work(
    redis: Redis, settings: Settings, proxy: FaultProxy
) -> None:
    """Only one worker, and it is the one behind the proxy: nobody else can cover for it."""
    fast = settings.model_copy(update={"reclaim_idle_ms": 1000, "reclaim_interval_ms": 200})
    await ensure_groups(redis, fast)
    bodies = lifecycle_order(500)
    async with running_worker(through(fast, proxy), consumer="alone") as worker:
        await publish_many(redis, fast, bodies[:1000])
        proxy.stall = True
        await publish_many(redis, fast, bodies[1000:])
        await asyncio.sleep(1.5)
        proxy.reset()
        proxy.refuse = True
        await asyncio.sleep(1.0)
        proxy.heal()
        await wait_for_results(redis, fast, len(bodies), timeout=60)
        while await pending(redis, fast):
            await asyncio.sleep(0.1)
        assert worker.ready
    report = await audit(redis, fast)
    assert_exactly_once(report, [b["event_id"] for b in bodies])
    assert report.rejected == []
