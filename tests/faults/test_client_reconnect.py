"""Redis restarts under a user's client: the first call of ``WorkingMemory``, ``LifecycleClient``
and the CLI afterwards succeeds (a new connection, the call retried), and a publish retried
after its reply was lost takes no second seq."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from redis.asyncio import Redis

from tests.faults.support import FaultProxy, OwnRedis
from tests.helpers import running_worker, worker_env
from worker.keys import StreamKeys
from worker.lifecycle.client import LifecycleClient
from worker.memory import WorkingMemory
from worker.settings import Settings

pytestmark = pytest.mark.faults


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path / "data")
    server.data_dir.mkdir()
    server.start()
    yield server
    server.stop()


def restart(server: OwnRedis) -> None:
    server.kill()
    server.start()


async def test_working_memory_answers_the_first_call_after_a_restart(
    own_redis: OwnRedis, prefix: str
) -> None:
    settings = Settings(redis_url=own_redis.url, stream_prefix=prefix)
    async with await WorkingMemory.for_session("s1", "p", settings=settings) as memory:
        await memory.set("plan", {"steps": 3})
        restart(own_redis)
        assert await memory.get("plan") == {"steps": 3}
        restart(own_redis)
        await memory.set("plan", {"steps": 4})
        assert await memory.get("plan") == {"steps": 4}


async def test_the_client_publishes_right_after_a_restart(own_redis: OwnRedis, prefix: str) -> None:
    settings = Settings(redis_url=own_redis.url, stream_prefix=prefix)
    async with LifecycleClient(settings=settings) as client:
        await client.spawn("p", "s1", "a")
        restart(own_redis)  # the script cache is empty now, the pooled connection dead
        await client.pause("p", "s1", "a")
        restart(own_redis)
        await client.resume("p", "s1", "a")
    check = Redis.from_url(own_redis.url)
    rows: Any = await check.xrange(StreamKeys(prefix, 0).lifecycle)
    await check.aclose()
    assert [orjson.loads(f[b"data"])["seq"] for _i, f in rows] == [1, 2, 3]


async def test_the_cli_waits_for_a_redis_that_is_starting(own_redis: OwnRedis, prefix: str) -> None:
    settings = Settings(redis_url=own_redis.url, stream_prefix=prefix)
    own_redis.kill()
    env = worker_env(settings, MEMWORKER_REDIS_RETRY_SECONDS="30")
    cli = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "worker.cli", "publish", "spawn", "-p", "p", "-s", "s1"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    await asyncio.sleep(3)  # the CLI is up and finds no Redis
    own_redis.start()
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0, err.decode()
    check = Redis.from_url(own_redis.url)
    rows: Any = await check.xrange(StreamKeys(prefix, 0).lifecycle)
    await check.aclose()
    assert [json.loads(f[b"data"])["event_id"] for _i, f in rows] == [out.decode().strip()]


class LosesAScriptReply(FaultProxy):
    """Forwards everything, except that once armed, the reply to the next EVALSHA is lost:
    Redis runs the script, the connection closes before the client reads the answer."""

    armed = False
    _doomed: tuple[asyncio.StreamWriter, asyncio.StreamWriter] | None = None

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        to_server = dst is pair[1]
        try:
            while data := await src.read(1 << 16):
                if to_server and self.armed and b"EVALSHA" in data:
                    self.armed, self._doomed = False, pair
                if not to_server and self._doomed is pair:
                    self._doomed = None
                    self.faults["lost reply"] += 1
                    break
                dst.write(data)
                await dst.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            self._pairs.discard(pair)
            for writer in pair:
                writer.close()


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[LosesAScriptReply]:
    target = urlsplit(redis_url)
    proxy = LosesAScriptReply(target.hostname or "127.0.0.1", target.port or 6379)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def test_a_publish_whose_reply_was_lost_is_retried_without_a_second_seq(
    redis: Redis, settings: Settings, proxy: LosesAScriptReply
) -> None:
    path = urlsplit(settings.redis_url).path or "/0"
    through = settings.model_copy(update={"redis_url": f"redis://{proxy.address}{path}"})
    async with LifecycleClient(settings=through) as client:
        await client.spawn("p", "s1", "a")
        proxy.armed = True
        paused = await client.pause("p", "s1", "a")
        assert proxy.faults["lost reply"] == 1, "the pause's reply was lost and retried"
        terminated = await client.terminate("p", "s1", "a")
        rows: Any = await redis.xrange(StreamKeys(settings.stream_prefix, 0).lifecycle)
        sent = [
            (orjson.loads(f[b"data"])["event_id"], orjson.loads(f[b"data"])["seq"])
            for _i, f in rows
        ]
        assert [seq for _e, seq in sent] == [1, 2, 3]
        assert sent[1][0] == paused
        async with running_worker(settings):
            result = await client.wait(terminated, timeout=10)
    assert result.type == "agent.terminated", "the terminate did not wait for a seq gap"
