"""Stream retention trimming as hard as it can (retention 0 s, every 50 ms) while commands
stream in, some wait for a seq gap, and a slow downstream group reads the results: nothing a
group has not acknowledged may be trimmed, so every command still gets its result and the
slow reader still sees every result."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from tests.faults.support import (
    audit,
    ensure_groups,
    figures,
    lifecycle_order,
    pending,
    publish_many,
    session_command,
    states,
)
from tests.helpers import running_worker
from worker.consumers.groups import ensure_group
from worker.keys import CONSOLIDATION_GROUP, StreamKeys
from worker.settings import Settings

pytestmark = pytest.mark.faults

SESSIONS = 1_500  # x 4 = 6,000 commands, plus 200 sessions that wait for a seq gap
LATE = 200


async def test_retention_during_a_run_trims_only_what_every_group_acknowledged(
    redis: Redis, settings: Settings
) -> None:
    trimming = settings.model_copy(
        update={
            "retention_seconds": 0.0,
            "retention_interval_seconds": 0.05,
            "seq_retry_ms": 50,
            "seq_gap_timeout_seconds": 30.0,
            "reclaim_idle_ms": 1000,
            "reclaim_interval_ms": 200,
        }
    )
    streams = StreamKeys(trimming.stream_prefix, 0)
    await ensure_groups(redis, trimming)
    await ensure_group(redis, streams.results, CONSOLIDATION_GROUP)
    bodies = lifecycle_order(SESSIONS)
    early = [session_command(f"late{n}", seq) for seq in (2, 3, 4) for n in range(LATE)]
    first = [session_command(f"late{n}", 1) for n in range(LATE)]
    downstream: dict[str, int] = {}
    stop = asyncio.Event()
    lengths: list[int] = []

    async def slow_reader() -> None:
        """A downstream group that reads and acknowledges results slowly."""
        while not stop.is_set():
            reply: Any = await redis.xreadgroup(
                CONSOLIDATION_GROUP, "slow", {streams.results: ">"}, count=100, block=100
            )
            for _s, rows in reply or []:
                for _id, fields in rows:
                    cause = orjson.loads(fields[b"data"])["causation_id"]
                    downstream[cause] = downstream.get(cause, 0) + 1
                await asyncio.sleep(0.05)
                await redis.xack(streams.results, CONSOLIDATION_GROUP, *[i for i, _ in rows])

    async def sample_lengths() -> None:
        while not stop.is_set():
            lengths.append(int(await redis.xlen(streams.lifecycle)))
            await asyncio.sleep(0.1)

    started = time.monotonic()
    async with running_worker(trimming, consumer="a"), running_worker(trimming, consumer="b"):
        tasks = [asyncio.create_task(slow_reader()), asyncio.create_task(sample_lengths())]
        for i in range(0, len(bodies), 500):
            if i == len(bodies) // 2:
                # Seq 2-4 of some sessions mid-run: they wait (pending, held in the retry book)
                # while retention trims the acknowledged entries on both sides of them.
                await publish_many(redis, trimming, early)
            await publish_many(redis, trimming, bodies[i : i + 500])
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        assert await pending(redis, trimming) >= len(early), "the early entries are waiting"
        waiting_length = int(await redis.xlen(streams.lifecycle))
        await publish_many(redis, trimming, first)
        expected = len(bodies) + len(early) + len(first)
        deadline = time.monotonic() + 120
        while len(downstream) < expected or await pending(redis, trimming):
            assert time.monotonic() < deadline, f"downstream saw {len(downstream)}/{expected}"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks)
    info: Any = await redis.xinfo_stream(streams.lifecycle)
    report = await audit(redis, trimming)
    event_ids = [b["event_id"] for b in bodies + early + first]
    # The results stream is trimmed too once the slow group acknowledged: count downstream.
    assert set(downstream) == set(event_ids), "the slow group saw every result"
    assert max(downstream.values()) == 1
    assert report.dead == []
    assert int(info["entries-added"]) == expected
    assert waiting_length < expected, "retention trimmed around the waiting entries"
    assert int(info["length"]) < expected // 2, "retention did trim the lifecycle stream"
    sessions = [f"s{n}" for n in range(SESSIONS)] + [f"late{n}" for n in range(LATE)]
    assert await states(redis, trimming, sessions) == {"terminated": len(sessions)}
    leftover = await audit(redis, trimming)
    assert leftover.duplicated == 0
    figures(
        "retention",
        commands=expected,
        waiting_on_seq_gap=len(early),
        lifecycle_entries_added=int(info["entries-added"]),
        lifecycle_length_max=max(lengths),
        lifecycle_length_while_gap_waited=waiting_length,
        lifecycle_length_end=int(info["length"]),
        results_left_untrimmed=len(report.results),
        lost=len(set(event_ids) - set(downstream)),
        duplicated=sum(n - 1 for n in downstream.values()),
        elapsed_s=round(time.monotonic() - started, 1),
    )
