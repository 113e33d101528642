"""A Sentinel failover mid-run: the worker finds the new primary and goes on, exactly once."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis as sync_redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError

from tests.helpers import running_worker, wait_until
from tests.redis_process import free_port, server_binary
from worker.connections import client_for
from worker.keys import StreamKeys
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings


def start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [server_binary(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def wait_for(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
            if found:
                return found
        except (sync_redis.ConnectionError, sync_redis.ResponseError):
            pass
        time.sleep(0.05)
    raise RuntimeError("condition not met")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _promotable(sentinel: sync_redis.Redis) -> bool:
    """The Sentinel sees the replica, connected and in sync: a failover can promote it."""
    replicas = sentinel.execute_command(  # type: ignore[no-untyped-call]
        "SENTINEL", "replicas", "memworker"
    )
    for replica in replicas or []:
        if not isinstance(replica, dict):  # a flat [key, value, …] list
            replica = dict(zip(replica[::2], replica[1::2], strict=True))
        info = {_text(k): _text(v) for k, v in replica.items()}
        if info.get("flags") == "slave" and info.get("master-link-status") == "ok":
            return True
    return False


async def publish_retrying(client: LifecycleClient, event_id: str, session: str) -> str:
    """Publish as an orchestrator would across a failover: retry with the same event_id
    (the client's connection to the demoted primary is closed under it)."""
    for _ in range(50):
        try:
            return await client.pause("p", session, "a", event_id=event_id)
        except (RedisConnectionError, ReadOnlyError):
            await asyncio.sleep(0.1)
    raise AssertionError("could not publish across the failover")


@pytest.fixture
def replicated(tmp_path: Path, prefix: str) -> Iterator[tuple[Settings, int, int]]:
    primary, replica, sentinel = free_port(), free_port(), free_port()
    procs = [
        start(
            [
                "--port",
                str(primary),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
            ]
        ),
        start(
            [
                "--port",
                str(replica),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
                "--replicaof",
                "127.0.0.1",
                str(primary),
            ]
        ),
    ]
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {sentinel}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor memworker 127.0.0.1 {primary} 1\n"
        "sentinel down-after-milliseconds memworker 1000\n"
        "sentinel failover-timeout memworker 5000\n"
    )
    try:
        replica_client = sync_redis.Redis(host="127.0.0.1", port=replica)
        wait_for(lambda: replica_client.info("replication")["master_link_status"] == "up")  # type: ignore[index]
        procs.append(start([str(conf), "--sentinel"]))
        probe = sync_redis.Redis(host="127.0.0.1", port=sentinel)
        wait_for(lambda: _promotable(probe))
        yield (
            Settings(
                redis_url=f"redis://127.0.0.1:{sentinel}/0",
                redis_sentinel_service="memworker",
                stream_prefix=prefix,
                reclaim_interval_ms=100,
                reclaim_idle_ms=1000,
            ),
            primary,
            replica,
        )
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


async def test_after_a_failover_the_worker_applies_on_the_new_primary_exactly_once(
    replicated: tuple[Settings, int, int],
) -> None:
    settings, primary_port, replica_port = replicated
    redis: Any = client_for(settings)
    client = LifecycleClient(redis, settings)
    sent = [await client.spawn("p", f"s{n}", "a", {"n": n}) for n in range(20)]
    async with running_worker(settings) as worker:
        await client.wait(sent[-1], timeout=20)
        sentinel = sync_redis.Redis.from_url(settings.redis_url)
        # Sentinel promotes only a replica whose INFO it refreshed in the last few seconds
        # (NOGOODSLAVE otherwise): ask until it accepts.
        wait_for(
            lambda: sentinel.execute_command(  # type: ignore[no-untyped-call]
                "SENTINEL", "FAILOVER", "memworker"
            )
        )
        wait_for(
            lambda: (
                int(
                    sentinel.execute_command(  # type: ignore[no-untyped-call]
                        "SENTINEL", "get-master-addr-by-name", "memworker"
                    )[1]
                )
                == replica_port
            )
        )
        # Until the Sentinel demotes the old primary (on its next INFO poll), both accept
        # writes; wait for the demotion, so the worker's connection really goes stale.
        old = sync_redis.Redis(host="127.0.0.1", port=primary_port)
        wait_for(lambda: old.execute_command("ROLE")[0] == b"slave")  # type: ignore[no-untyped-call]
        for n in range(20):
            sent.append(await publish_retrying(client, f"pause-{n}", f"s{n}"))

        async def all_results() -> bool:
            try:
                return int(await redis.xlen(StreamKeys(settings.stream_prefix, 0).results)) == 40
            except Exception:
                return False

        await wait_until(all_results, timeout=60)

        async def ready() -> bool:
            return worker.ready

        await wait_until(ready, timeout=20)
    rows: Any = await redis.xrange(StreamKeys(settings.stream_prefix, 0).results)
    results = [orjson.loads(f[b"data"]) for _i, f in rows]
    assert Counter(r["causation_id"] for r in results) == Counter(sent)
    assert [r for r in results if r["type"] == "command.rejected"] == []
    await redis.aclose()
