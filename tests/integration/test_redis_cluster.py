"""The lifecycle worker, the client and working memory on a 3-node Redis Cluster, 4 shards."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from tests.helpers import running_worker, wait_until, worker_env
from tests.redis_cluster import redis_cluster
from worker.connections import client_for, shard_urls
from worker.keys import SessionKeys, StreamKeys, shard_of
from worker.lifecycle.client import LifecycleClient, NotReplicatedError
from worker.memory import WorkingMemory
from worker.redis_conditions import RedisConditionError
from worker.settings import Settings


@pytest.fixture
def cluster_settings(tmp_path: Path, prefix: str) -> Iterator[Settings]:
    with redis_cluster(tmp_path) as ports:
        yield Settings(
            redis_url=f"redis://127.0.0.1:{ports[0]}/0",
            redis_cluster=True,
            shards=4,
            stream_prefix=prefix,
            reclaim_idle_ms=500,
            reclaim_interval_ms=100,
            seq_retry_ms=20,
        )


async def test_shards_are_spread_over_the_cluster_nodes(cluster_settings: Settings) -> None:
    urls = await shard_urls(cluster_settings)
    assert len(urls) == 4
    assert len(set(urls.values())) >= 2, "the 4 shards' hash tags land on several nodes"


async def test_the_lifecycle_end_to_end_runs_on_a_cluster(cluster_settings: Settings) -> None:
    settings = cluster_settings
    redis: Any = client_for(settings)
    client = LifecycleClient(redis, settings)
    sessions = [f"s{n}" for n in range(100)]
    sent: list[str] = []
    for session in sessions:
        sent.append(await client.spawn("proj", session, "a", {"n": session}))
    for kind in ("pause", "resume", "terminate"):
        for session in sessions:
            sent.append(
                await client.publish(
                    {
                        "type": kind,
                        "project_id": "proj",
                        "session_id": session,
                        "agent_instance_id": "a",
                    }
                )
            )
    async with running_worker(settings):

        async def all_results() -> bool:
            total = 0
            for shard in range(4):
                total += int(await redis.xlen(StreamKeys(settings.stream_prefix, shard).results))
            return total == len(sent)

        await wait_until(all_results, timeout=60)
    results: list[dict[str, Any]] = []
    for shard in range(4):
        rows = await redis.xrange(StreamKeys(settings.stream_prefix, shard).results)
        results += [orjson.loads(f[b"data"]) for _i, f in rows]
    assert Counter(r["causation_id"] for r in results) == Counter(sent)
    assert [r for r in results if r["type"] == "command.rejected"] == []
    terminated = [r for r in results if r["type"] == "agent.terminated"]
    assert sorted(r["snapshot"]["variables"]["n"] for r in terminated) == sorted(sessions)
    for session in sessions:
        keys = SessionKeys.for_session(settings.stream_prefix, 4, "proj", session)
        assert await redis.hget(keys.meta, "state") == b"terminated"
    await redis.aclose()


async def test_working_memory_works_on_a_cluster(cluster_settings: Settings) -> None:
    for session in ("a", "b", "c", "d"):
        memory = await WorkingMemory.for_session(session, project_id="p", settings=cluster_settings)
        await memory.set("k", {"session": session})
        checkpoint = await memory.create_checkpoint("before")
        await memory.set("k", "changed")
        await memory.restore_checkpoint(checkpoint)
        assert await memory.get("k") == {"session": session}
        await memory.close()


async def test_the_consolidator_stores_episodes_from_every_shard_of_a_cluster(
    cluster_settings: Settings, database_url: str
) -> None:
    from sqlalchemy import func, select
    from sqlalchemy.ext.asyncio import create_async_engine

    from worker.consolidation.consolidator import Consolidator
    from worker.db.migrate import migrate
    from worker.db.models import Episode

    settings = cluster_settings.model_copy(update={"database_url": database_url})
    await migrate(database_url)
    redis: Any = client_for(settings)
    client = LifecycleClient(redis, settings)
    last = ""
    for n in range(20):
        await client.spawn("proj", f"s{n}", "a")
        last = await client.terminate("proj", f"s{n}", "a")
    async with running_worker(settings):
        await client.wait(last, timeout=30)

        async def all_done() -> bool:
            total = 0
            for shard in range(4):
                total += int(await redis.xlen(StreamKeys(settings.stream_prefix, shard).results))
            return total == 40

        await wait_until(all_done, timeout=30)
    consolidator = Consolidator.from_settings(settings)
    try:
        await consolidator.run_once()
    finally:
        await consolidator.close()
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            count = (await conn.execute(select(func.count()).select_from(Episode))).scalar()
    finally:
        await engine.dispose()
    assert count == 20
    await redis.aclose()


async def test_stats_on_a_cluster_lists_every_shard_and_says_capacity_is_not_measured(
    cluster_settings: Settings,
) -> None:
    def memworker(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "worker.cli", *args],
            env=worker_env(cluster_settings, MEMWORKER_REDIS_CLUSTER="true"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    async with running_worker(cluster_settings):
        client = LifecycleClient(settings=cluster_settings)
        try:
            await client.wait(await client.spawn("p", "s1", "a"), timeout=10)
        finally:
            await client.close()
    done = await asyncio.to_thread(memworker, "stats", "--rate-seconds", "0")
    assert done.returncode == 0, done.stderr
    assert "capacity: not measured on a Redis Cluster" in done.stdout
    # shard → node: every shard on the master of its hash tag's slot, no credentials
    urls = await shard_urls(cluster_settings)
    for shard, url in urls.items():
        node = url.split("//", 1)[1].rsplit("/", 1)[0]
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"shards on {node}:"))
        assert str(shard) in line.split(":", 2)[2].split()
    shown = await asyncio.to_thread(memworker, "stats", "--json")
    data = orjson.loads(shown.stdout)
    assert data["capacity"] is None
    assert data["shard_nodes"] == {
        str(k): v.split("//", 1)[1].rsplit("/", 1)[0] for k, v in urls.items()
    }
    lifecycle = {StreamKeys(cluster_settings.stream_prefix, i).lifecycle for i in range(4)}
    assert lifecycle <= {row["stream"] for row in data["streams"]}


async def test_admission_closes_only_for_the_shards_of_the_nearly_full_node(
    cluster_settings: Settings,
) -> None:
    settings = cluster_settings.model_copy(update={"admission_interval_ms": 50})
    urls = await shard_urls(settings)
    full_url = urls[0]
    full_shards = {shard for shard, url in urls.items() if url == full_url}
    sessions = [f"s{n}" for n in range(1_000)]
    on_full = next(s for s in sessions if shard_of("proj", s, 4) in full_shards)
    elsewhere = next(s for s in sessions if shard_of("proj", s, 4) not in full_shards)
    node = Redis.from_url(full_url)
    redis: Any = client_for(settings)
    client = LifecycleClient(redis, settings)
    try:
        async with running_worker(settings) as worker:
            used = int((await node.info("memory"))["used_memory"])
            await node.config_set("maxmemory", str(used * 100 // 93))  # 93 % used: past 90 %
            try:
                await wait_until(lambda: _is(worker.admission.closed), timeout=30)
                with pytest.raises(RedisConditionError, match="Redis is nearly full"):
                    await client.spawn("proj", on_full, "a", {"n": 1})
                spawned = await client.wait(await client.spawn("proj", elsewhere, "a", {"n": 1}))
                assert spawned.type == "agent.spawned"
            finally:
                await node.config_set("maxmemory", "0")
            await wait_until(lambda: _is(not worker.admission.closed), timeout=30)
            spawned = await client.wait(await client.spawn("proj", on_full, "a", {"n": 1}))
            assert spawned.type == "agent.spawned"
    finally:
        await node.aclose()
        await redis.aclose()


async def _is(value: bool) -> bool:
    return value


async def test_a_command_whose_session_slot_is_migrating_is_held_not_dead_lettered(
    cluster_settings: Settings,
) -> None:
    """The apply function is given a session's meta key; its other keys it derives. While
    the session's slot migrates, a key not on the node (a pause's checkpoints) is a cluster
    condition (TRYAGAIN): the command is held and applied once the slot is stable, never
    dead-lettered however long the migration takes."""
    settings = cluster_settings.model_copy(update={"max_deliveries": 2})
    redis: Any = client_for(settings)
    client = LifecycleClient(redis, settings)
    keys = SessionKeys.for_session(settings.stream_prefix, 4, "proj", "moving")
    urls = await shard_urls(settings)
    owner: Any = Redis.from_url(urls[keys.shard])
    other_url = next(u for u in set(urls.values()) if u != urls[keys.shard])
    other: Any = Redis.from_url(other_url)
    try:
        async with running_worker(settings):
            spawned = await client.wait(await client.spawn("proj", "moving", "a", {"n": 1}))
            assert spawned.type == "agent.spawned"
            slot = int(await owner.execute_command("CLUSTER", "KEYSLOT", keys.meta))
            owner_id = (await owner.execute_command("CLUSTER", "MYID")).decode()
            other_id = (await other.execute_command("CLUSTER", "MYID")).decode()
            await other.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", owner_id)
            await owner.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", other_id)
            try:
                paused = await client.pause("proj", "moving", "a")
                await asyncio.sleep(3)  # many retries, far past max_deliveries were they errors
                assert await redis.xlen(keys.streams.dlq) == 0
                results = await redis.xrange(keys.streams.results)
                assert [orjson.loads(f[b"data"])["type"] for _, f in results] == ["agent.spawned"]
            finally:
                await owner.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
                await other.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            result = await client.wait(paused, timeout=30)
            assert result.type == "agent.paused"
            assert await redis.xlen(keys.streams.dlq) == 0
    finally:
        await owner.aclose()
        await other.aclose()
        await redis.aclose()


async def test_300_concurrent_calls_succeed_on_a_cluster(
    cluster_settings: Settings,
) -> None:
    # Each node's pool opens what the calls need (MEMWORKER_REDIS_MAX_CONNECTIONS caps
    # standalone and Sentinel clients; docs/reference/configuration.md).
    settings = cluster_settings
    async with LifecycleClient(settings=settings) as client:
        sent = await asyncio.gather(*(client.spawn("p", f"s{i}", "a") for i in range(300)))
    async with await WorkingMemory.for_session("s1", "p", settings=settings) as memory:
        await asyncio.gather(*(memory.set(f"k{i}", i) for i in range(300)))
        values = await asyncio.gather(*(memory.get(f"k{i}") for i in range(300)))
    assert len(set(sent)) == 300
    assert values == list(range(300))


async def test_publish_waiting_for_replicas_on_a_cluster_says_none_confirmed(
    cluster_settings: Settings,
) -> None:
    """The test cluster has no replicas: the WAIT goes to the stream's node, and says 0."""
    redis: Any = client_for(cluster_settings)
    client = LifecycleClient(redis, cluster_settings)
    await client.spawn("proj", "waits", "a", {}, event_id="w-1")  # a plain publish first
    with pytest.raises(NotReplicatedError) as raised:
        await client.publish(
            {
                "type": "pause",
                "project_id": "proj",
                "session_id": "waits",
                "agent_instance_id": "a",
                "event_id": "w-2",
            },
            replicas=1,
            replicas_timeout=0.2,
        )
    assert raised.value.acknowledged == 0
    async with running_worker(cluster_settings):
        assert (await client.wait("w-2", timeout=30)).type == "agent.paused"
    await redis.aclose()
