"""A Redis Cluster master SIGKILLed under traffic: its replica is promoted, and every command
is answered exactly once, in seq order, none rejected (3 masters + 3 replicas, 12 shards).

The orchestrator here does what docs/contract.md ("Failover") says: each command is published
with ``replicas=1`` and its result awaited; a publish that fails is retried with the same
event id, and one without a result in time is republished with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio.cluster import RedisCluster

from tests.helpers import running_worker
from tests.redis_cluster import redis_cluster_with_replicas
from worker.keys import StreamKeys
from worker.lifecycle.client import LifecycleClient, NotReplicatedError, ResultTimeoutError
from worker.settings import Settings

SHARDS = 12


@pytest.fixture
def cluster(tmp_path: Path, prefix: str) -> Iterator[tuple[Settings, Any, list[int]]]:
    with redis_cluster_with_replicas(tmp_path) as (masters, _replicas, procs):
        settings = Settings(
            redis_url=f"redis://127.0.0.1:{masters[0]}/0",
            redis_cluster=True,
            shards=SHARDS,
            stream_prefix=prefix,
            reclaim_idle_ms=500,
            reclaim_interval_ms=100,
            seq_retry_ms=20,
        )
        yield settings, procs, masters


async def test_a_master_killed_under_traffic_loses_no_command_and_answers_each_once(
    cluster: tuple[Settings, Any, list[int]],
) -> None:
    settings, procs, masters = cluster
    client = LifecycleClient(settings=settings)
    sent: list[str] = []
    stop = asyncio.Event()
    counts = Counter[str]()

    async def command(body: dict[str, Any]) -> None:
        sent.append(body["event_id"])
        while True:
            try:
                await client.publish(body, replicas=1, replicas_timeout=0.5)
            except NotReplicatedError:
                counts["at_risk"] += 1  # published; its master has no replica any more
            except Exception:  # the failover: unreachable, CLUSTERDOWN, MOVED, …
                counts["retried"] += 1
                await asyncio.sleep(0.1)
                continue
            try:
                await client.wait(
                    body["event_id"],
                    timeout=5,
                    project_id=body["project_id"],
                    session_id=body["session_id"],
                )
                return
            except (ResultTimeoutError, Exception):
                counts["republished"] += 1

    async def sessions(n: int) -> None:
        life = 0
        while not stop.is_set():
            session, life = f"s{n}-{life}", life + 1
            for kind in ("spawn", "pause", "resume", "terminate"):
                await command(
                    {
                        "type": kind,
                        "project_id": "p",
                        "session_id": session,
                        "agent_instance_id": "a",
                        "event_id": f"{session}-{kind}",
                    }
                )

    async with running_worker(settings):
        loops = [asyncio.create_task(sessions(n)) for n in range(16)]
        await asyncio.sleep(2)
        victim = masters[1]  # not the seed of the URL
        procs[victim].kill()
        before = len(sent)
        await asyncio.sleep(8)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*loops), timeout=120)
    await client.close()
    assert len(sent) > before, "commands went on after the master died"

    reader: Any = RedisCluster.from_url(settings.redis_url)
    results: list[dict[str, Any]] = []
    for shard in range(SHARDS):
        with contextlib.suppress(Exception):
            rows = await reader.xrange(StreamKeys(settings.stream_prefix, shard).results)
            results += [orjson.loads(f[b"data"]) for _i, f in rows]
    await reader.aclose()
    assert Counter(r["causation_id"] for r in results) == Counter(sent)
    assert [r for r in results if r["type"] == "command.rejected"] == []
    by_session: dict[str, list[int]] = {}
    for r in results:
        by_session.setdefault(r["session_id"], []).append(r["seq"])
    assert all(seqs == sorted(seqs) for seqs in by_session.values())
