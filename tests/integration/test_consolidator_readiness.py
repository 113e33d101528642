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
from sqlalchemy import make_url

from tests.helpers import wait_until, worker_env
from tests.redis_process import free_port
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
def consolidating(settings: Settings, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "consolidate", "--metrics-port", str(port)],
            env=worker_env(settings),
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
