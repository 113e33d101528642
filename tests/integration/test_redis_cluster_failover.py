"""A Redis Cluster master SIGKILLed under traffic: its replica is promoted, and every command
is answered exactly once, in seq order, none rejected (3 masters + 3 replicas, 12 shards).

The orchestrator here does what docs/contract.md ("Failover") says: each command is published
with ``replicas=1`` and its result awaited; a publish that fails is retried with the same
event id, and one without a result in time is republished with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio.cluster import RedisCluster

from tests.helpers import running_worker
from tests.redis_cluster import redis_cluster_with_replicas
from worker.connections import cluster_shard_nodes
from worker.keys import StreamKeys, shard_of
from worker.lifecycle.client import LifecycleClient, NotReplicatedError, ResultTimeoutError
from worker.redis_conditions import RedisConditionError
from worker.settings import Settings

SHARDS = 12


@pytest.fixture(params=[()])
def cluster(
    tmp_path: Path, prefix: str, request: pytest.FixtureRequest
) -> Iterator[tuple[Settings, Any, list[int]]]:
    with redis_cluster_with_replicas(tmp_path, *request.param) as (masters, _replicas, procs):
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


@pytest.mark.parametrize("cluster", [("--cluster-require-full-coverage", "no")], indirect=True)
async def test_shards_on_live_masters_are_served_while_one_master_is_silent(
    cluster: tuple[Settings, Any, list[int]],
) -> None:
    """A master that stops answering without closing its connections (a container killed on
    a bridge network, a host gone: SIGSTOP here) must hold only its own shards: commands for
    shards on the other masters go on being answered within seconds, not after the 30 s a
    read of the silent node waits for its reply. (The live masters serve their slots while
    one is down: ``cluster-require-full-coverage no``, as docker-compose.cluster.yml runs
    them; with Redis's default every node answers CLUSTERDOWN until the failover.)"""
    settings, procs, masters = cluster
    victim = masters[1]
    nodes = await cluster_shard_nodes(settings)
    live = [shard for shard, (_host, port) in nodes.items() if port != victim]
    assert live and len(live) < SHARDS, "the 12 shards are spread over the three masters"
    client = LifecycleClient(settings=settings)
    answered: list[float] = []
    stop = asyncio.Event()

    async def session_loop(n: int) -> None:
        life = 0
        while not stop.is_set():
            life += 1
            session = f"live-{n}-{life}"
            if shard_of("p", session, SHARDS) not in live:
                continue  # only sessions on the live masters' shards
            for kind in ("spawn", "pause", "resume", "terminate"):
                body = {
                    "type": kind,
                    "project_id": "p",
                    "session_id": session,
                    "agent_instance_id": "a",
                    "event_id": f"{session}-{kind}",
                }
                while True:  # the cluster refuses everything (CLUSTERDOWN) until it fails over
                    try:
                        await client.publish(dict(body))
                        await client.wait(body["event_id"], timeout=60)
                        break
                    except RedisConditionError:
                        await asyncio.sleep(0.1)
                answered.append(time.monotonic())

    try:
        async with running_worker(settings):
            loops = [asyncio.create_task(session_loop(n)) for n in range(8)]
            await asyncio.sleep(2)
            procs[victim].send_signal(signal.SIGSTOP)
            silenced = time.monotonic()
            await asyncio.sleep(10)
            stop.set()
            window = [silenced, *(t for t in answered if t >= silenced), time.monotonic()]
            procs[victim].send_signal(signal.SIGCONT)
            await asyncio.wait_for(asyncio.gather(*loops), timeout=120)
    finally:
        procs[victim].send_signal(signal.SIGCONT)
        await client.close()
    longest = max(b - a for a, b in itertools.pairwise(window))
    assert len(window) > 20, f"{len(window) - 2} commands answered in the 10 s of silence"
    assert longest < 5, f"{longest:.1f} s without an answer on the live masters' shards"
