"""Handlers slower than the reclaim idle time: a peer reclaims entries that are still being
worked on, and both consumers end up applying the same entries. The dedupe record (checked in
the same Lua script that applies) must make every second apply a no-op: one effect, one result.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.faults.support import (
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
from tests.helpers import running_worker
from worker.keys import SessionKeys
from worker.lifecycle.apply import Outcome
from worker.lifecycle.worker import Entry, LifecycleWorker
from worker.settings import Settings

pytestmark = pytest.mark.faults

SESSIONS = 400  # x 4 = 1,600 commands
IDLE_MS = 200
SLOWNESS = 0.6  # seconds added before each batch is applied: 3x the reclaim idle time


def slow_down(worker: LifecycleWorker, seconds: float, seen: Counter[str]) -> None:
    """Make this in-process worker's processing slow (on the new-entry and reclaim paths alike)
    and count what the apply script answered. Redis itself is untouched."""
    dispatch, apply_batch, settle = worker.dispatch, worker.apply_batch, worker._settle

    async def slow_dispatch(shard: int, entries: Sequence[Entry]) -> None:
        await asyncio.sleep(seconds)
        await dispatch(shard, entries)

    async def slow_apply(shard: int, entries: Sequence[Entry]) -> list[Outcome]:
        if entries:
            await asyncio.sleep(seconds)
        return await apply_batch(shard, entries)

    async def counting(shard: int, outcome: Outcome, fields: Mapping[bytes, bytes]) -> None:
        seen[outcome.status] += 1
        await settle(shard, outcome, fields)

    worker.dispatch = slow_dispatch  # type: ignore[method-assign]
    worker.apply_batch = slow_apply  # type: ignore[method-assign]
    worker._settle = counting  # type: ignore[method-assign]


async def test_handlers_slower_than_the_reclaim_idle_time_apply_each_command_once(
    redis: Redis, settings: Settings
) -> None:
    slow = settings.model_copy(
        update={
            "reclaim_idle_ms": IDLE_MS,
            "reclaim_interval_ms": 50,
            "batch_size": 50,
            "seq_retry_ms": 50,
            "max_deliveries": 5,
        }
    )
    await ensure_groups(redis, slow)
    bodies = lifecycle_order(SESSIONS)
    seen: Counter[str] = Counter()
    started = time.monotonic()
    async with running_worker(slow, consumer="a") as a, running_worker(slow, consumer="b") as b:
        slow_down(a, SLOWNESS, seen)
        slow_down(b, SLOWNESS, seen)
        await publish_many(redis, slow, bodies)
        await wait_for_results(redis, slow, len(bodies), timeout=180)
        while await pending(redis, slow):
            await asyncio.sleep(0.1)
        await asyncio.sleep(2 * SLOWNESS)  # batches still sleeping finish as no-ops
    report = await audit(redis, slow)
    event_ids = [b["event_id"] for b in bodies]
    assert_exactly_once(report, event_ids)
    assert report.rejected == []
    assert report.dead == []
    assert seen["duplicate"] > 0, f"no entry was applied twice, the race never happened: {seen}"
    sessions = [f"s{n}" for n in range(SESSIONS)]
    assert await states(redis, slow, sessions) == {"terminated": SESSIONS}
    # One effect per command: each session paused once, so it has exactly one checkpoint.
    pipe = redis.pipeline(transaction=False)
    for session in sessions:
        pipe.hget(SessionKeys.for_session(slow.stream_prefix, 1, "proj", session).meta, "last_seq")
    assert set(await pipe.execute()) == {b"4"}
    figures(
        "slow_handlers",
        commands=len(bodies),
        reclaim_idle_ms=IDLE_MS,
        handler_delay_ms=int(SLOWNESS * 1000),
        outcomes=dict(seen),
        lost=len(report.missing(event_ids)),
        duplicated=report.duplicated,
        elapsed_s=round(time.monotonic() - started, 1),
    )


async def test_a_slow_consumer_and_a_fast_one_still_give_one_result_per_command(
    redis: Redis, settings: Settings
) -> None:
    """Only one consumer is slow; the fast one reclaims its batches while it sleeps."""
    slow = settings.model_copy(
        update={"reclaim_idle_ms": IDLE_MS, "reclaim_interval_ms": 50, "batch_size": 100}
    )
    await ensure_groups(redis, slow)
    bodies = lifecycle_order(500)
    seen: Counter[str] = Counter()
    fast_seen: Counter[str] = Counter()
    async with (
        running_worker(slow, consumer="slow") as tortoise,
        running_worker(slow, consumer="fast") as hare,
    ):
        slow_down(tortoise, 1.0, seen)
        slow_down(hare, 0.0, fast_seen)
        await publish_many(redis, slow, bodies)
        await wait_for_results(redis, slow, len(bodies), timeout=120)
        while await pending(redis, slow):
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)
    report = await audit(redis, slow)
    assert_exactly_once(report, [b["event_id"] for b in bodies])
    assert report.rejected == []
    assert report.dead == []
    both: dict[str, Any] = {"slow": dict(seen), "fast": dict(fast_seen)}
    assert seen["duplicate"] + fast_seen["duplicate"] > 0, both
