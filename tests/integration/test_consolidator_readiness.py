"""`memworker consolidate` is ready only when it can use both Redis and Postgres, and its
/readyz and `memworker_ready` gauge always agree (a real subprocess, real servers)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import make_url, text

from tests.helpers import wait_until, worker_env
from tests.integration.results_factory import migrated_engine, publish, session_story
from tests.redis_process import free_port
from worker.consumers.groups import ensure_group
from worker.keys import CONSOLIDATION_GROUP, StreamKeys
from worker.settings import Settings


def readyz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)
    except OSError:
        return None


def ready_gauge(port: int) -> float | None:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return None
    for line in body.decode().splitlines():
        if line.startswith("memworker_ready "):
            return float(line.split()[1])
    return None


@contextmanager
def consolidating(
    settings: Settings, port: int, log: Path, **extra: str
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "consolidate", "--metrics-port", str(port)],
            env=worker_env(settings, **extra),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def warnings(log: Path) -> list[dict[str, object]]:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [orjson.loads(line) for line in lines if line.startswith("{")]


@pytest.mark.usefixtures("redis")  # its teardown deletes the streams left under prefix
async def test_a_consolidator_that_cannot_log_in_to_postgres_is_not_ready_and_says_why(
    redis_url: str, postgres_url: str, prefix: str, tmp_path: Path
) -> None:
    wrong = make_url(postgres_url).set(username="no_such_role_memworker", password="x")
    settings = Settings(
        redis_url=redis_url,
        database_url=wrong.render_as_string(hide_password=False),
        stream_prefix=prefix,
    )
    port, log = free_port(), tmp_path / "consolidator.log"
    with consolidating(settings, port, log) as proc:

        async def said_why() -> bool:
            assert proc.poll() is None, "the consolidator must wait, not exit"
            return any("storage unavailable" in str(w.get("event")) for w in warnings(log))

        await wait_until(said_why, timeout=60)
        assert await asyncio.to_thread(readyz, port) == 503
        assert await asyncio.to_thread(ready_gauge, port) == 0.0

    (line,) = {str(w["error"]) for w in warnings(log) if "storage unavailable" in str(w["event"])}
    assert 'role "no_such_role_memworker" does not exist' in line
    assert "\n" not in line


@pytest.mark.usefixtures("redis")  # its teardown deletes the streams left under prefix
async def test_a_consolidator_that_can_use_both_servers_is_ready_and_its_gauge_agrees(
    redis_url: str, database_url: str, prefix: str, tmp_path: Path
) -> None:
    settings = Settings(redis_url=redis_url, database_url=database_url, stream_prefix=prefix)
    port, log = free_port(), tmp_path / "consolidator.log"
    with consolidating(settings, port, log) as proc:

        async def ready() -> bool:
            assert proc.poll() is None
            return await asyncio.to_thread(readyz, port) == 200

        await wait_until(ready, timeout=60)
        assert await asyncio.to_thread(ready_gauge, port) == 1.0


def metric_lines(port: int, name: str) -> list[str]:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return []
    return [line for line in body.decode().splitlines() if line.startswith(name + "{")]


async def test_a_consolidator_takes_over_a_dead_ones_results_after_the_reclaim_idle_setting(
    redis: Redis, redis_url: str, database_url: str, prefix: str, tmp_path: Path
) -> None:
    """``MEMWORKER_RECLAIM_IDLE_MS`` holds for the consolidator as for every group, and its lag
    and pending count on each results stream are on its /metrics like the worker's."""
    settings = Settings(
        redis_url=redis_url, database_url=database_url, stream_prefix=prefix, shards=1
    )
    async with migrated_engine(database_url):
        pass
    stream = StreamKeys(prefix, 0).results
    await ensure_group(redis, stream, CONSOLIDATION_GROUP)
    await publish(redis, settings, session_story("p-reclaim", "s-1"))
    await redis.xreadgroup(CONSOLIDATION_GROUP, "died", {stream: ">"}, count=100)  # then died
    assert int((await redis.xpending(stream, CONSOLIDATION_GROUP))["pending"]) == 5

    port, log = free_port(), tmp_path / "consolidator.log"
    with consolidating(settings, port, log, MEMWORKER_RECLAIM_IDLE_MS="1000") as proc:

        async def taken_over() -> bool:
            assert proc.poll() is None
            pending = await redis.xpending(stream, CONSOLIDATION_GROUP)
            return int(pending["pending"]) == 0

        await wait_until(taken_over, timeout=30)  # the old hard-wired idle was 60 s

        def gauges() -> list[str]:
            return metric_lines(port, "memworker_stream_pending") + metric_lines(
                port, "memworker_stream_lag"
            )

        async def exported() -> bool:
            mine = [g for g in await asyncio.to_thread(gauges) if f'stream="{stream}"' in g]
            return len([g for g in mine if 'group="consolidation"' in g]) == 2

        await wait_until(exported, timeout=30)
    async with migrated_engine(database_url) as engine, engine.connect() as conn:
        stored = await conn.scalar(
            text("SELECT count(*) FROM lifecycle_events WHERE project_id = 'p-reclaim'")
        )
    assert stored == 5
