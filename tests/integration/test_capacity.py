"""Capacity in `memworker stats` and in the gauges, and dead consumers, against real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from tests.helpers import running_worker
from tests.integration.test_client_and_cli import memworker
from tests.redis_process import RedisProcess
from worker.keys import CONSOLIDATION_GROUP, StreamKeys
from worker.lifecycle.client import LifecycleClient
from worker.ops.capacity import measure_capacity
from worker.settings import Settings


async def finish_sessions(redis: Redis, settings: Settings, live: int, finished: int) -> None:
    client = LifecycleClient(redis, settings)
    for i in range(live + finished):
        await client.wait(
            await client.spawn("p", f"s{i}", "a", {"goal": "x" * 40, "n": i}), timeout=10
        )
    for i in range(finished):
        await client.wait(await client.terminate("p", f"s{i}", "a"), timeout=10)


async def test_stats_measures_bytes_per_live_and_finished_session_and_per_entry(
    redis: Redis, settings: Settings
) -> None:
    async with running_worker(settings):
        await finish_sessions(redis, settings, live=3, finished=4)
    # Every key read (a sample of the whole keyspace would estimate the counts).
    every = ("--rate-seconds", "0", "--sample-keys", "1000000000")
    done = await asyncio.to_thread(memworker, settings, "stats", "--json", *every)
    assert done.returncode == 0, done.stderr
    capacity = json.loads(done.stdout)["capacity"]
    assert capacity["used_memory"] > 0
    # The shared server has no maxmemory (and must never get one from a test).
    assert capacity["maxmemory"] == 0 and capacity["verdict"].startswith("no maxmemory")
    # Only this test's prefix is counted, whatever else the server holds.
    assert capacity["live_sessions"] == 3 and capacity["finished_sessions"] == 4
    # 11 commands for 7 sessions, counted by dedupe records or, in a layout that keeps them
    # in the session's own keys, from the lifecycle stream.
    assert capacity["commands_per_session"] == pytest.approx(11 / 7)
    live, tombstone = capacity["bytes_per_live_session"], capacity["bytes_per_tombstone"]
    assert live > tombstone > 0, "a live session holds more than its tombstone"
    # A finished session leaves its tombstone, its seq counter and its dedupe records.
    assert capacity["bytes_per_finished_session"] > tombstone
    assert capacity["bytes_per_lifecycle_entry"] > 0 and capacity["bytes_per_result_entry"] > 0
    assert capacity["commands_per_second_per_gb"] > 0

    table = await asyncio.to_thread(memworker, settings, "stats", *every)
    assert table.returncode == 0, table.stderr
    assert "Redis memory:" in table.stdout and "per finished session" in table.stdout
    assert "no maxmemory" in table.stdout


async def test_a_session_measured_alone_matches_memory_usage_of_its_keys(
    redis: Redis, settings: Settings
) -> None:
    async with running_worker(settings):
        await finish_sessions(redis, settings, live=1, finished=1)
    capacity = await measure_capacity(redis, settings, rate_seconds=0, max_keys=10**9)
    assert capacity.scan_complete
    tombstone = 0
    async for key in redis.scan_iter(match=f"{settings.stream_prefix}:{{*}}:s:p/s0:*"):
        tombstone += int(await redis.memory_usage(key) or 0)
    assert capacity.bytes_per_tombstone is not None
    assert capacity.bytes_per_tombstone == tombstone


@pytest.fixture
def capped_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path, persistent=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def publishing(redis: Redis, settings: Settings) -> AsyncIterator[None]:
    """Spawn sessions without pause for the duration of the block."""
    client = LifecycleClient(redis, settings)

    async def spawn_forever() -> None:
        i = 0
        while True:
            try:
                await client.spawn("p", f"load{i}", "a", {"k": "v" * 200})
            except Exception as exc:  # Redis full (however the client words it): stop
                if not any(word in str(exc) for word in ("maxmemory", "OOM", "full")):
                    raise
                return
            i += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(spawn_forever())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_stats_says_when_a_capped_redis_fills_at_the_current_rate(
    capped_redis: RedisProcess, prefix: str
) -> None:
    # A day of retention: at any rate this publisher reaches (≥ 1 command/s, however busy
    # the machine), the streams alone then hold more than the 50 MB of room below.
    settings = Settings(redis_url=capped_redis.url, stream_prefix=prefix, retention_seconds=86_400)
    day = {"MEMWORKER_RETENTION_SECONDS": "86400"}
    redis = Redis.from_url(capped_redis.url)
    try:
        async with running_worker(settings), publishing(redis, settings):
            await asyncio.sleep(1)
            used = int((await redis.info("memory"))["used_memory"])
            await redis.config_set("maxmemory", str(used + 50_000_000))
            done = await asyncio.to_thread(
                memworker, settings, "stats", "--json", "--rate-seconds", "1", env=day
            )
        assert done.returncode == 0, done.stderr
        capacity = json.loads(done.stdout)["capacity"]
        assert capacity["maxmemory"] == used + 50_000_000
        assert capacity["commands_per_second"] > 0
        assert capacity["verdict"].startswith("full in")
        assert 0 < capacity["seconds_until_full"] < 86_400
        assert capacity["steady_state_used_memory"] > capacity["maxmemory"]

        # With nothing arriving, it is not filling.
        done = await asyncio.to_thread(
            memworker, settings, "stats", "--json", "--rate-seconds", "1", env=day
        )
        capacity = json.loads(done.stdout)["capacity"]
        assert capacity["commands_per_second"] == 0
        assert capacity["seconds_until_full"] is None
        assert capacity["verdict"].startswith("not filling")
    finally:
        await redis.aclose()


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_the_lag_probe_refreshes_the_capacity_gauges(
    capped_redis: RedisProcess, prefix: str
) -> None:
    # A server of its own: every key is this test's, so a probe's SCAN page sees them.
    settings = Settings(redis_url=capped_redis.url, stream_prefix=prefix)
    redis = Redis.from_url(capped_redis.url)
    try:
        async with running_worker(settings) as worker:
            await finish_sessions(redis, settings, live=2, finished=2)
            for _ in range(3):  # the rate needs two readings
                await worker.probe_lag()
        measured = worker.capacity.probe.last  # the last refresh, the worker stopped
    finally:
        await redis.aclose()
    assert measured is not None
    assert gauge("memworker_redis_used_memory_bytes") == measured.used_memory > 0
    assert gauge("memworker_redis_max_memory_bytes") == 0
    assert measured.bytes_per_finished_session and measured.bytes_per_live_session
    assert gauge("memworker_redis_bytes_per_finished_session") == pytest.approx(
        measured.bytes_per_finished_session
    )
    assert gauge("memworker_redis_bytes_per_live_session") == pytest.approx(
        measured.bytes_per_live_session
    )
    results = StreamKeys(settings.stream_prefix, 0).results
    assert (gauge("memworker_redis_bytes_per_stream_entry", stream=results) or 0) > 0
    until_full = gauge("memworker_redis_seconds_until_full")
    assert until_full is not None and math.isinf(until_full)  # no maxmemory here


async def consumers_of(redis: Redis, stream: str, group: str) -> dict[str, Any]:
    return {c["name"].decode(): c for c in await redis.xinfo_consumers(stream, group)}


async def test_stats_marks_dead_consumers_and_prunes_only_those_without_pending_entries(
    redis: Redis, settings: Settings
) -> None:
    results = StreamKeys(settings.stream_prefix, 0).results
    await redis.xadd(results, {"data": b"{}"})
    await redis.xgroup_create(results, CONSOLIDATION_GROUP, id="0", mkstream=True)
    # A consumer that read an entry and died holding it; one that died with nothing pending.
    await redis.xreadgroup(CONSOLIDATION_GROUP, "gone-holding", {results: ">"}, count=1)
    await redis.xgroup_createconsumer(results, CONSOLIDATION_GROUP, "gone-empty")
    await asyncio.sleep(2.2)
    async with reading(redis, results, "alive"):
        await show_prune_and_check(redis, settings, results)


@contextlib.asynccontextmanager
async def reading(redis: Redis, stream: str, consumer: str) -> AsyncIterator[None]:
    """A live consumer: every 100 ms during the block it is delivered an entry and acks it.

    Deliveries, not idle reads: Redis 7.0 neither creates a consumer for an XREADGROUP that
    blocks and times out nor refreshes its idle time (Valkey does both)."""

    async def read_forever() -> None:
        while True:
            await redis.xadd(stream, {"data": b"{}"})
            got: Any = await redis.xreadgroup(
                CONSOLIDATION_GROUP, consumer, {stream: ">"}, count=10, block=100
            )
            ids = [entry_id for _name, entries in got for entry_id, _fields in entries]
            if ids:
                await redis.xack(stream, CONSOLIDATION_GROUP, *ids)
            await asyncio.sleep(0.1)

    task = asyncio.create_task(read_forever())
    await asyncio.sleep(0.2)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def show_prune_and_check(redis: Redis, settings: Settings, results: str) -> None:
    shown = await asyncio.to_thread(
        memworker, settings, "stats", "--json", "--dead-after", "2", "--rate-seconds", "0"
    )
    assert shown.returncode == 0, shown.stderr
    row = next(
        r
        for r in json.loads(shown.stdout)["streams"]
        if r["stream"] == results and r["group"] == CONSOLIDATION_GROUP
    )
    assert row["consumers"] == 3
    assert row["dead_consumers"] == ["gone-empty"]
    assert row["stalled_consumers"] == ["gone-holding"]
    table = await asyncio.to_thread(
        memworker, settings, "stats", "--dead-after", "2", "--rate-seconds", "0"
    )
    assert "3 (2 dead)" in table.stdout
    assert "memworker stats --prune-dead-consumers" in table.stdout

    pruned = await asyncio.to_thread(
        memworker,
        settings,
        "stats",
        "--prune-dead-consumers",
        "--dead-after",
        "2",
        "--rate-seconds",
        "0",
    )
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned consumer gone-empty" in pruned.stdout
    left = await consumers_of(redis, results, CONSOLIDATION_GROUP)
    assert set(left) == {"gone-holding", "alive"}
    # The entry the dead consumer held is still pending, to be reclaimed: nothing was lost.
    summary: Any = await redis.xpending(results, CONSOLIDATION_GROUP)
    held = {c["name"].decode(): int(c["pending"]) for c in summary["consumers"]}
    assert held["gone-holding"] == 1


async def test_a_server_that_refuses_sampling_turns_the_capacity_gauges_off_not_the_probe(
    capped_redis: RedisProcess, prefix: str
) -> None:
    admin = Redis.from_url(capped_redis.url)
    await admin.acl_setuser(
        "no-memory", enabled=True, nopass=True, keys=["*"], commands=["+@all", "-memory"]
    )
    settings = Settings(
        redis_url=capped_redis.url.replace("redis://", "redis://no-memory:x@"), stream_prefix=prefix
    )
    try:
        async with running_worker(settings) as worker:
            await LifecycleClient(admin, settings).spawn("p", "s1", "a")
            await worker.probe_lag()  # lag gauges refreshed, no exception
            assert not worker.capacity.enabled
            await worker.probe_lag()
            lifecycle = StreamKeys(prefix, 0).lifecycle
            assert gauge("memworker_stream_lag", stream=lifecycle, group="lifecycle") is not None
    finally:
        await admin.aclose()


async def test_a_worker_of_a_previous_run_shows_as_dead_and_is_pruned(
    redis: Redis, settings: Settings
) -> None:
    async with running_worker(settings, consumer="previous-run"):
        await finish_sessions(redis, settings, live=1, finished=0)
    await asyncio.sleep(1.1)
    lifecycle = StreamKeys(settings.stream_prefix, 0).lifecycle
    args = ("stats", "--json", "--dead-after", "1", "--rate-seconds", "0")
    shown = json.loads((await asyncio.to_thread(memworker, settings, *args)).stdout)
    row = next(r for r in shown["streams"] if r["stream"] == lifecycle)
    assert row["dead_consumers"] == ["previous-run"]
    pruned = await asyncio.to_thread(memworker, settings, *args, "--prune-dead-consumers")
    assert json.loads(pruned.stdout)["pruned_consumers"] == [
        {"stream": lifecycle, "group": "lifecycle", "consumer": "previous-run"}
    ]
    assert await redis.xinfo_consumers(lifecycle, "lifecycle") == []


async def test_with_no_dedupe_records_to_count_commands_per_session_come_from_the_stream(
    redis: Redis, settings: Settings
) -> None:
    async with running_worker(settings):
        await finish_sessions(redis, settings, live=1, finished=2)  # 3 spawns, 2 terminates
    with_records = await measure_capacity(redis, settings, rate_seconds=0, max_keys=10**9)
    async for key in redis.scan_iter(match=f"{settings.stream_prefix}:{{*}}:evt:*"):
        await redis.delete(key)  # as a layout without one key per dedupe record would be
    capacity = await measure_capacity(redis, settings, rate_seconds=0, max_keys=10**9)
    assert capacity.dedupe_records == 0
    assert capacity.commands_per_session == pytest.approx(5 / 3)
    assert with_records.commands_per_session == pytest.approx(5 / 3)  # from the records


async def test_stats_counts_the_episodes_stream_in_what_a_command_leaves(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    from tests.integration.results_factory import migrated_engine
    from worker.consolidation.consolidator import Consolidator
    from worker.keys import episodes_stream

    async with running_worker(settings):
        await finish_sessions(redis, settings, live=3, finished=4)  # 11 commands, 4 episodes
    async with migrated_engine(database_url) as engine:
        await Consolidator(settings, redis, engine).run_once()
    stream = episodes_stream(settings.stream_prefix)
    assert await redis.xlen(stream) == 4

    every = ("--rate-seconds", "0", "--sample-keys", "1000000000")
    done = await asyncio.to_thread(memworker, settings, "stats", "--json", *every)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    capacity = shown["capacity"]
    per_entry = int(await redis.memory_usage(stream) or 0) / 4
    assert capacity["bytes_per_episodes_entry"] == pytest.approx(per_entry)
    assert capacity["episodes_per_command"] == pytest.approx(4 / 11)
    # Its share is held for the retention, like the other streams' entries: without the
    # stream, a command leaves exactly that much less.
    with_episodes = await measure_capacity(redis, settings, rate_seconds=0, max_keys=10**9)
    await redis.delete(stream)
    without = await measure_capacity(redis, settings, rate_seconds=0, max_keys=10**9)
    assert with_episodes.byte_seconds_per_command is not None
    assert without.byte_seconds_per_command is not None
    assert with_episodes.byte_seconds_per_command - without.byte_seconds_per_command == (
        pytest.approx(per_entry * 4 / 11 * settings.retention_seconds)
    )
    assert any(r["stream"] == stream and r["length"] == 4 for r in shown["streams"])

    table = await asyncio.to_thread(memworker, settings, "stats", *every)
    assert "per episodes entry" in table.stdout
