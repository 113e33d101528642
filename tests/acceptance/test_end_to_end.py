"""End to end: commands in, episodes out; replay rebuilds; metrics move; dev mode works."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

from tests.helpers import running_worker, wait_until, worker_env
from tests.redis_process import free_port
from worker.consolidation.consolidator import Consolidator
from worker.consolidation.replay import ResultRange, replay_results_from_stream
from worker.db.migrate import migrate
from worker.db.models import Episode
from worker.keys import StreamKeys, episodes_stream
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings

pytestmark = pytest.mark.slow


async def episode_rows(database_url: str) -> list[tuple[Any, ...]]:
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(
                    Episode.id,
                    Episode.project_id,
                    Episode.session_id,
                    Episode.outcome,
                    Episode.lessons_learned,
                    Episode.snapshot,
                ).order_by(Episode.session_id)
            )
            return [tuple(r) for r in rows.all()]
    finally:
        await engine.dispose()


async def test_replaying_results_into_a_fresh_database_rebuilds_the_same_episodes(
    redis: Redis, settings: Settings, database_url: str, postgres_url: str
) -> None:
    live = settings.model_copy(update={"database_url": database_url})
    await migrate(database_url)
    async with running_worker(live):
        client = LifecycleClient(redis, live)
        for n in range(20):
            await client.spawn("proj", f"s{n}", "a", {"n": n})
            sent = await client.terminate("proj", f"s{n}", "a", lessons_learned=[f"lesson {n}"])
        await client.wait(sent, timeout=20)
    consolidator = Consolidator.from_settings(live)
    try:
        await consolidator.run_once()
    finally:
        await consolidator.close()
    original = await episode_rows(database_url)
    assert len(original) == 20

    from sqlalchemy import make_url, text

    fresh_name = f"{make_url(database_url).database}_replay"
    admin = create_async_engine(postgres_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{fresh_name}"'))
    fresh = make_url(database_url).set(database=fresh_name).render_as_string(hide_password=False)
    try:
        await migrate(fresh)
        rebuilt = live.model_copy(update={"database_url": fresh})
        first = await replay_results_from_stream(redis, rebuilt, 0, ResultRange())
        second = await replay_results_from_stream(redis, rebuilt, 0, ResultRange())
        assert first["new_episodes"] == 20
        assert second["new_episodes"] == 0, "replaying twice changes nothing"
        assert await episode_rows(fresh) == original
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{fresh_name}" WITH (FORCE)'))
        await admin.dispose()


def scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def metric(values: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in values.items() if k.startswith(prefix))


async def test_metrics_scraped_under_load_move_and_lag_returns_to_zero(
    redis: Redis, settings: Settings
) -> None:
    port = free_port()
    env = worker_env(settings, MEMWORKER_LAG_PROBE_SECONDS="0.2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "run", "--metrics-port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        async def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        await wait_until(ready, timeout=30)
        stream = StreamKeys(settings.stream_prefix, 0).lifecycle
        lag_name = f'memworker_stream_lag{{group="lifecycle",stream="{stream}"}}'
        samples = []
        for wave in range(5):
            pipe = redis.pipeline(transaction=False)
            for n in range(2000):
                body = {
                    "type": "spawn",
                    "event_id": f"w{wave}-{n}",
                    "project_id": "p",
                    "session_id": f"w{wave}-{n}",
                    "agent_instance_id": "a",
                }
                pipe.xadd(stream, {"data": orjson.dumps(body)})
            await pipe.execute()
            samples.append(await asyncio.to_thread(scrape, port))
        applied = 'memworker_commands_total{command="spawn",reason="",status="applied"}'

        async def drained() -> bool:
            values = await asyncio.to_thread(scrape, port)
            return values.get(applied) == 10_000 and values.get(lag_name) == 0

        await wait_until(drained, timeout=60)
        counts = [s.get(applied, 0) for s in samples]
        assert counts == sorted(counts), "the counter only moves forward"
        final = await asyncio.to_thread(scrape, port)
        assert metric(final, "memworker_batch_size_count") > 1
        assert final["memworker_ready"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


async def test_dev_mode_brings_everything_up_on_embedded_servers(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "dev",
            "--data-dir",
            str(tmp_path / "data"),
            "--metrics-port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    env_file = tmp_path / "data" / "dev.env"
    try:

        async def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
            return env_file.exists()

        await wait_until(up, timeout=120)
        exported = dict(
            line.removeprefix("export ").replace("'", "").split("=", 1)
            for line in env_file.read_text().splitlines()
        )
        cli_env = {**env, **exported}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "worker.cli", *args],
                env=cli_env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        spawned = await asyncio.to_thread(
            cli, "publish", "spawn", "-p", "demo", "-s", "s1", "--state", '{"goal": "hi"}', "--wait"
        )
        assert spawned.returncode == 0, spawned.stderr
        assert orjson.loads(spawned.stdout)["type"] == "agent.spawned"
        ended = await asyncio.to_thread(
            cli, "publish", "terminate", "-p", "demo", "-s", "s1", "--wait"
        )
        assert orjson.loads(ended.stdout)["type"] == "agent.terminated"
        shown = await asyncio.to_thread(
            cli, "tail", "episodes", "--from-start", "--count", "1", "--json"
        )
        assert shown.returncode == 0, shown.stderr
        event = orjson.loads(shown.stdout.splitlines()[0])
        assert event["data"]["type"] == "episode.recorded"
        assert event["stream"] == episodes_stream("agents")
        engine = create_async_engine(exported["DATABASE_URL"])
        try:
            async with engine.connect() as conn:
                assert (await conn.execute(select(func.count()).select_from(Episode))).scalar() == 1
        finally:
            await engine.dispose()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
