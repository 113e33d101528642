"""Redis behind Sentinel: the settings name the Sentinels and the service; every component
finds the master through them."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis

from tests.helpers import running_worker
from tests.redis_process import RedisProcess, free_port, server_binary
from worker.connections import client_for, shard_urls
from worker.lifecycle.client import LifecycleClient
from worker.memory import WorkingMemory
from worker.settings import Settings


@pytest.fixture
def sentinel_settings(tmp_path: Path, prefix: str) -> Iterator[Settings]:
    master = RedisProcess(tmp_path / "master", persistent=False)
    (tmp_path / "master").mkdir()
    master.start()
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor memworker 127.0.0.1 {master.port} 1\n"
    )
    proc = subprocess.Popen(
        [server_binary(), str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        probe = sync_redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                if probe.execute_command(  # type: ignore[no-untyped-call]
                    "SENTINEL", "get-master-addr-by-name", "memworker"
                ):
                    break
            except sync_redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the test sentinel did not come up")
            time.sleep(0.05)
        probe.close()
        yield Settings(
            redis_url=f"redis://127.0.0.1:{port}/0",
            redis_sentinel_service="memworker",
            stream_prefix=prefix,
        )
        assert master.port
    finally:
        proc.kill()
        proc.wait()
        master.stop()


async def test_the_worker_client_and_memory_find_the_master_through_sentinel(
    sentinel_settings: Settings,
) -> None:
    settings = sentinel_settings
    urls = await shard_urls(settings)
    assert "127.0.0.1" in urls[0] and settings.redis_url not in urls[0]
    redis: Any = client_for(settings)
    client = LifecycleClient(redis, settings)
    async with running_worker(settings):
        spawned = await client.wait(await client.spawn("p", "s1", "a", {"k": 1}), timeout=20)
        memory = await WorkingMemory.for_session("s1", project_id="p", settings=settings)
        assert await memory.get("k") == 1
        await memory.close()
        ended = await client.wait(await client.terminate("p", "s1", "a"), timeout=20)
    assert spawned.type == "agent.spawned"
    assert ended.type == "agent.terminated"
    await redis.aclose()


async def test_300_concurrent_calls_wait_for_the_masters_connections(
    sentinel_settings: Settings,
) -> None:
    settings = sentinel_settings.model_copy(update={"redis_max_connections": 8})
    async with LifecycleClient(settings=settings) as client:
        sent = await asyncio.gather(*(client.spawn("p", f"s{i}", "a") for i in range(300)))
    async with await WorkingMemory.for_session("s1", "p", settings=settings) as memory:
        await asyncio.gather(*(memory.set(f"k{i}", i) for i in range(300)))
        values = await asyncio.gather(*(memory.get(f"k{i}") for i in range(300)))
    assert len(set(sent)) == 300
    assert values == list(range(300))
