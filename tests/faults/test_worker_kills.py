"""Worker processes killed with SIGKILL mid-batch, again and again, while commands stream in."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.faults.support import (
    assert_exactly_once,
    audit,
    ensure_groups,
    figures,
    lifecycle_order,
    log_errors,
    pending,
    publish_many,
    start_worker,
    states,
    stop_worker,
    wait_for_results,
)
from worker.keys import LIFECYCLE_GROUP, StreamKeys
from worker.settings import Settings

pytestmark = pytest.mark.faults

SESSIONS = 12_500  # x 4 commands = 50,000
WORKERS = 3
KILLS = 5


async def consumer_pending_ids(
    redis: Redis, settings: Settings, consumer: str
) -> set[tuple[int, str]]:
    ids: set[tuple[int, str]] = set()
    for shard in range(settings.shards):
        rows: Any = await redis.xpending_range(
            StreamKeys(settings.stream_prefix, shard).lifecycle,
            LIFECYCLE_GROUP,
            min="-",
            max="+",
            count=100_000,
            consumername=consumer,
        )
        ids |= {(shard, r["message_id"].decode()) for r in rows}
    return ids


async def still_pending(redis: Redis, settings: Settings, ids: set[Any]) -> int:
    left = 0
    for shard in range(settings.shards):
        rows: Any = await redis.xpending_range(
            StreamKeys(settings.stream_prefix, shard).lifecycle,
            LIFECYCLE_GROUP,
            min="-",
            max="+",
            count=200_000,
        )
        now = {r["message_id"].decode() for r in rows}
        left += sum(1 for s, i in ids if s == shard and i in now)
    return left


async def test_five_sigkills_of_three_workers_during_50000_commands_lose_and_double_nothing(
    redis: Redis, settings: Settings, tmp_path: Path
) -> None:
    sharded = settings.model_copy(update={"shards": 2})
    await ensure_groups(redis, sharded)
    env = {"MEMWORKER_RECLAIM_IDLE_MS": "1000", "MEMWORKER_RECLAIM_INTERVAL_MS": "200"}
    logs = [tmp_path / f"w{i}.log" for i in range(WORKERS)]
    procs: list[subprocess.Popen[bytes]] = [
        start_worker(sharded, f"w{i}", logs[i], **env) for i in range(WORKERS)
    ]
    bodies = lifecycle_order(SESSIONS)
    event_ids = [b["event_id"] for b in bodies]
    started = time.monotonic()

    async def stream_commands() -> None:
        """4,000 commands/s: the run lasts long enough for five kills to land mid-stream."""
        for i in range(0, len(bodies), 1000):
            await publish_many(redis, sharded, bodies[i : i + 1000])
            await asyncio.sleep(0.25)

    publisher = asyncio.create_task(stream_commands())
    kills: list[dict[str, Any]] = []
    recoveries: list[asyncio.Task[float]] = []

    async def recovered(ids: set[Any], at: float) -> float:
        while await still_pending(redis, sharded, ids):
            await asyncio.sleep(0.05)
        return time.monotonic() - at

    try:
        await wait_for_results(redis, sharded, 2000, timeout=60)
        for k in range(KILLS):
            victim = k % WORKERS
            # Land the kill while the victim holds delivered, unacknowledged entries.
            deadline = time.monotonic() + 3
            held: set[Any] = set()
            while time.monotonic() < deadline:
                held = await consumer_pending_ids(redis, sharded, f"w{victim}")
                if len(held) >= 50:
                    break
                await asyncio.sleep(0.01)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            at = time.monotonic()
            done = await redis_results(redis, sharded)
            kills.append({"worker": f"w{victim}", "pending_at_kill": len(held), "results": done})
            recoveries.append(asyncio.create_task(recovered(held, at)))
            # The process manager restarts it under the same name: it drains its own pending
            # entries first, unless a peer's reclaim loop took them over meanwhile.
            procs[victim] = start_worker(sharded, f"w{victim}", logs[victim], **env)
            await asyncio.sleep(1.5)
        await publisher
        waited = await wait_for_results(redis, sharded, len(bodies), timeout=300)
        recovery = [round(await r, 2) for r in recoveries]
        while await pending(redis, sharded):
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
    finally:
        publisher.cancel()
        for proc in procs:
            stop_worker(proc)
    elapsed = time.monotonic() - started
    report = await audit(redis, sharded)
    assert len(kills) == KILLS
    assert sum(1 for k in kills if k["pending_at_kill"]) >= 3, f"kills not mid-batch: {kills}"
    assert all(k["results"] < len(bodies) for k in kills), "every kill landed mid-run"
    assert_exactly_once(report, event_ids)
    assert report.rejected == [], report.rejected[:3]
    assert report.dead == []
    assert await states(redis, sharded, [f"s{n}" for n in range(SESSIONS)]) == {
        "terminated": SESSIONS
    }
    assert await pending(redis, sharded) == 0
    for log in logs:
        assert log_errors(log) == [], log_errors(log)[:5]
    figures(
        "sigkill",
        commands=len(bodies),
        workers=WORKERS,
        kills=kills,
        lost=len(report.missing(event_ids)),
        duplicated=report.duplicated,
        recovery_seconds=recovery,
        drain_after_publish_seconds=round(waited, 1),
        elapsed_seconds=round(elapsed, 1),
    )


async def redis_results(redis: Redis, settings: Settings) -> int:
    n = 0
    for shard in range(settings.shards):
        n += int(await redis.xlen(StreamKeys(settings.stream_prefix, shard).results))
    return n
