"""One tenant cannot fill the shared Redis through working memory: a session's variables are
capped in bytes (``MEMWORKER_MAX_SESSION_BYTES``, 413 naming it), and writes that grow a
session are refused while Redis is nearly full (past maxmemory less
``MEMWORKER_ADMISSION_RESERVE``), as publishes are, so the reserve stays for the lifecycle
worker. Before, 53 writes of 1 MB went straight through the reserve to maxmemory."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tests.cli_process import Memworker
from tests.faults.test_server_conditions import client, own_redis
from tests.helpers import running_worker, spawn_session, worker_env
from tests.integration.test_access import AUTH, PROJECT, TOKEN, free_port, migrated
from tests.redis_process import RedisProcess
from worker.memory import (
    LimitExceededError,
    RedisUnavailableError,
    SessionBytesExceededError,
    WorkingMemory,
)
from worker.settings import Settings

__all__ = ["client", "own_redis"]  # fixtures: our own Redis, and a client of it

pytestmark = pytest.mark.faults

MB = 1_048_576


async def settled_used_memory(client: Redis) -> int:
    """The most of a few readings over half a second (client buffers come and go)."""
    readings = []
    for _ in range(5):
        readings.append(int((await client.info("memory"))["used_memory"]))
        await asyncio.sleep(0.1)
    return max(readings)


async def test_a_sessions_variables_are_capped_in_bytes(redis: Redis, settings: Settings) -> None:
    settings = settings.model_copy(update={"max_session_bytes": 10_000})
    memory = await WorkingMemory.for_session("s-cap", "p-cap", redis=redis, settings=settings)
    await memory.set("a", "x" * 4_000)
    await memory.set("b", "y" * 4_000)
    with pytest.raises(SessionBytesExceededError, match="MEMWORKER_MAX_SESSION_BYTES") as raised:
        await memory.set("c", "z" * 4_000)
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, LimitExceededError)
    assert raised.value.setting == "max_session_bytes" and raised.value.maximum == 10_000
    assert await memory.exists("c") is False
    await memory.set("a", "x" * 10)  # shrinking is always allowed
    await memory.set("c", "z" * 4_000)  # the room it freed
    await memory.delete("b")
    await memory.set("d", "w" * 4_000)  # the room the delete freed
    await memory.set("e", "v" * 1_000, ttl_seconds=0.05)
    await asyncio.sleep(0.1)
    await memory.set("f", "u" * 1_500)  # the expired key's room too
    await memory.clear()
    await memory.set("g", "t" * 9_000)  # counted afresh after a clear
    with pytest.raises(SessionBytesExceededError):
        await memory.set("h", "s" * 1_000)


async def test_the_cap_counts_a_spawns_initial_state(redis: Redis, settings: Settings) -> None:
    await spawn_session(redis, settings, "p-cap", "s-init")
    memory = await WorkingMemory.for_session(
        "s-init",
        "p-cap",
        redis=redis,
        settings=settings.model_copy(update={"max_session_bytes": 3_000}),
    )
    await memory.set("a", "x" * 1_000)
    checkpoint = await memory.create_checkpoint()
    await memory.set("b", "x" * 1_000)
    with pytest.raises(SessionBytesExceededError):
        await memory.set("c", "x" * 1_000)
    await memory.restore_checkpoint(checkpoint)  # back to "a" only: counted afresh
    await memory.set("c", "x" * 1_000)


async def test_working_memory_writes_are_refused_past_the_admission_limit_and_the_cap(
    own_redis: RedisProcess, client: Redis, prefix: str, database_url: str
) -> None:
    settings = await migrated(
        Settings(
            redis_url=own_redis.url,
            stream_prefix=prefix,
            admission_interval_ms=100,
            admission_reserve=0.3,
        ),
        database_url,
    )
    await spawn_session(client, settings, PROJECT, "w1")
    port = free_port()
    env = worker_env(settings, MEMWORKER_API_TOKEN=TOKEN, MEMWORKER_MAX_SESSION_BYTES=str(300_000))
    server = Memworker(
        ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
    )
    memory = await WorkingMemory.for_session("w1", PROJECT, redis=client, settings=settings)
    try:
        server.wait_for(f"memory API of project {PROJECT} on http://127.0.0.1:{port}")
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=30, headers=AUTH
        ) as http:

            async def wm_set(key: str, size: int) -> httpx.Response:
                body = {"session_id": "w1", "key": key, "value": "v" * size}
                return await http.post("/v1/wm_set", json=body)

            assert (await wm_set("fill1", 200_000)).status_code == 200
            over = await wm_set("fill2", 200_000)
            assert over.status_code == 413, over.text
            assert "MEMWORKER_MAX_SESSION_BYTES" in over.json()["error"]

            async with running_worker(settings) as worker:
                used = await settled_used_memory(client)
                await client.config_set("maxmemory-policy", "noeviction")
                await client.config_set("maxmemory", str(used + 2 * MB))
                # Another tenant's data fills Redis past the admission limit (70 % of the cap
                # here), then ~500 KB further, midway to the cap: client buffers coming and
                # going do not open admission again.
                more = 10
                for i in range(60):
                    if worker.admission.closed:
                        more -= 1
                        if not more:
                            break
                    with contextlib.suppress(ResponseError):  # OOM: at the cap already
                        await client.set(f"{prefix}:filler:{i}", b"f" * (50 * 1024))
                    await asyncio.sleep(0.15 if more == 10 else 0.01)
                await asyncio.sleep(0.3)
                assert worker.admission.closed
                refused = await wm_set("more", 10)
                assert refused.status_code == 503, refused.text
                assert refused.headers["Retry-After"].isdigit()
                error = refused.json()["error"]
                assert "Redis is nearly full" in error and "cannot reach" not in error, error
                with pytest.raises(RedisUnavailableError, match="nearly full") as raised:
                    await memory.set("more", 1)
                assert raised.value.condition.kind == "nearly_full"
                with pytest.raises(RedisUnavailableError, match="nearly full"):
                    await memory.append_scratchpad("note")
                assert (await wm_set("fill1", 100)).status_code == 200  # shrinking: allowed
                assert await memory.delete("fill1") is True  # freeing: allowed
                await client.config_set("maxmemory", "0")
                for _ in range(300):
                    if not worker.admission.closed:
                        break
                    await asyncio.sleep(0.05)
                assert (await wm_set("more", 10)).status_code == 200
    finally:
        server.close()
