"""Real ``memworker run`` processes: many at once, and one killed with SIGKILL mid-stream."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from tests.helpers import all_results, command, stream_len_at_least, worker_process
from worker.consumers.groups import ensure_group
from worker.keys import LIFECYCLE_GROUP, SessionKeys, StreamKeys, shard_of
from worker.settings import Settings

pytestmark = pytest.mark.slow


async def prefill(redis: Redis, settings: Settings, sessions: int, kinds: list[str]) -> int:
    """Publish every command of every session, with seq, interleaved across sessions."""
    for shard in range(settings.shards):
        await ensure_group(
            redis, StreamKeys(settings.stream_prefix, shard).lifecycle, LIFECYCLE_GROUP
        )
    pipe = redis.pipeline(transaction=False)
    total = 0
    for seq, kind in enumerate(kinds, start=1):
        for n in range(sessions):
            session = f"s{n}"
            shard = shard_of("proj", session, settings.shards)
            body = command(
                kind,
                f"{session}-{seq}",
                session=session,
                project="proj",
                seq=seq,
                **({"initial_state": {"n": n, "step": "start"}} if kind == "spawn" else {}),
            )
            pipe.xadd(
                StreamKeys(settings.stream_prefix, shard).lifecycle, {"data": orjson.dumps(body)}
            )
            total += 1
            if len(pipe) >= 1000:
                await pipe.execute()
    await pipe.execute()
    return total


async def total_results(redis: Redis, settings: Settings) -> int:
    return sum(
        [
            int(await redis.xlen(StreamKeys(settings.stream_prefix, s).results))
            for s in range(settings.shards)
        ]
    )


async def wait_for_total(redis: Redis, settings: Settings, n: int, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while await total_results(redis, settings) < n:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"only {await total_results(redis, settings)} of {n} results")
        await asyncio.sleep(0.2)


async def test_four_worker_processes_apply_1000_sessions_in_seq_order_exactly_once(
    redis: Redis, settings: Settings
) -> None:
    sharded = settings.model_copy(update={"shards": 2})
    kinds = ["spawn", "pause", "resume", "terminate"]
    total = await prefill(redis, sharded, 1000, kinds)
    procs = [
        worker_process(sharded, "--consumer", f"w{i}", MEMWORKER_RECLAIM_IDLE_MS="2000")
        for i in range(4)
    ]
    with procs[0], procs[1], procs[2], procs[3]:
        await wait_for_total(redis, sharded, total, timeout=180)
        await asyncio.sleep(0.5)
    out = await all_results(redis, sharded)
    per_command = Counter(r["causation_id"] for r in out)
    assert len(out) == total
    assert set(per_command.values()) == {1}, "exactly one result per command"
    assert [r for r in out if r["type"] == "command.rejected"] == []
    for n in range(1000):
        keys = SessionKeys.for_session(sharded.stream_prefix, 2, "proj", f"s{n}")
        assert await redis.hget(keys.meta, "state") == b"terminated"  # type: ignore[misc]
    groups = await redis.xinfo_consumers(
        StreamKeys(sharded.stream_prefix, 0).lifecycle, LIFECYCLE_GROUP
    )
    assert len(groups) >= 2, "the work was shared between processes"


async def test_a_worker_killed_mid_stream_loses_and_doubles_nothing(
    redis: Redis, settings: Settings
) -> None:
    kinds = ["spawn", "pause", "resume", "terminate"]
    total = await prefill(redis, settings, 5000, kinds)
    assert total == 20_000
    results = StreamKeys(settings.stream_prefix, 0).results
    with worker_process(settings, "--consumer", "victim") as victim:
        await stream_len_at_least(redis, results, 3000, timeout=60)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    done_at_kill = int(await redis.xlen(results))
    assert done_at_kill < total, "the kill must land mid-stream"
    with worker_process(
        settings,
        "--consumer",
        "survivor",
        MEMWORKER_RECLAIM_IDLE_MS="500",
        MEMWORKER_RECLAIM_INTERVAL_MS="200",
    ):
        await wait_for_total(redis, settings, total, timeout=180)
        await asyncio.sleep(1.0)
    out = await all_results(redis, settings)
    per_command = Counter(r["causation_id"] for r in out)
    assert len(out) == total, f"{len(out)} results for {total} commands"
    assert set(per_command.values()) == {1}
    assert [r for r in out if r["type"] == "command.rejected"] == []
    pending = await redis.xpending(StreamKeys(settings.stream_prefix, 0).lifecycle, LIFECYCLE_GROUP)
    assert pending["pending"] == 0


async def test_sigterm_finishes_the_batch_in_hand_and_leaves_the_rest_to_others(
    redis: Redis, settings: Settings
) -> None:
    total = await prefill(redis, settings, 5000, ["spawn", "pause", "resume", "terminate"])
    results = StreamKeys(settings.stream_prefix, 0).results
    lifecycle = StreamKeys(settings.stream_prefix, 0).lifecycle
    with worker_process(settings, "--consumer", "leaving") as leaving:
        await stream_len_at_least(redis, results, 2000, timeout=60)
        leaving.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(leaving.wait, 30)
    assert code == 0, "a graceful stop exits 0"
    done = int(await redis.xlen(results))
    assert done < total, "the stop must land mid-stream"
    info: Any = await redis.xinfo_groups(lifecycle)
    applied_and_acked = int(info[0]["entries-read"]) - int(info[0]["pending"])
    assert applied_and_acked == done, "every acknowledged command has its result, no other"
    with worker_process(
        settings,
        "--consumer",
        "successor",
        MEMWORKER_RECLAIM_IDLE_MS="300",
        MEMWORKER_RECLAIM_INTERVAL_MS="100",
    ):
        await wait_for_total(redis, settings, total, timeout=180)
        await asyncio.sleep(0.5)
    out = await all_results(redis, settings)
    assert len(out) == total
    assert set(Counter(r["causation_id"] for r in out).values()) == {1}
