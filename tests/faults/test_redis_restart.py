"""The Redis server killed (SIGKILL) and restarted from its AOF while commands stream in.

What a restart loses depends on Redis's own durability mode, and that is measured here, not
hidden: commands whose XADD was acknowledged before the kill and are gone after the restart,
and results a subscriber saw before the kill that are gone after it. The worker must notice the
outage (not ready), reconnect by itself, and apply everything that survived exactly once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from tests.faults.support import (
    OwnRedis,
    audit,
    ensure_groups,
    figures,
    lifecycle_order,
    pending,
)
from tests.helpers import running_worker
from worker.keys import StreamKeys
from worker.settings import Settings

pytestmark = pytest.mark.faults

SESSIONS = 2_500  # x 4 = 10,000 commands


@pytest.fixture(params=["everysec", "always"])
def own_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    server = OwnRedis(tmp_path / "data", appendfsync=request.param)
    server.data_dir.mkdir()
    server.start()
    yield server
    server.stop()


async def test_a_redis_killed_and_restarted_mid_run_is_rejoined_and_its_losses_measured(
    own_redis: OwnRedis, prefix: str
) -> None:
    settings = Settings(
        redis_url=own_redis.url,
        stream_prefix=prefix,
        reclaim_idle_ms=1000,
        reclaim_interval_ms=200,
        seq_gap_timeout_seconds=3.0,
    )
    streams = StreamKeys(prefix, 0)
    # Retries a command whose pooled connection died with the server (an orchestrator's
    # client would reconnect the same way): a read right after the restart may pick one.
    client = Redis.from_url(
        own_redis.url,
        socket_timeout=2,
        socket_connect_timeout=1,
        retry=Retry(ExponentialBackoff(cap=0.5), 10),
        retry_on_error=[RedisConnectionError],
    )
    await ensure_groups(client, settings)
    bodies = lifecycle_order(SESSIONS)
    acked: dict[str, float] = {}
    seen: dict[str, str] = {}
    readiness: list[tuple[float, bool]] = []
    stop = asyncio.Event()

    async def publisher() -> None:
        """2,000 commands/s in pipelines of 100; a pipeline that fails is sent again, as an
        orchestrator retrying with the same event_ids would."""
        for i in range(0, len(bodies), 100):
            chunk = bodies[i : i + 100]
            while True:
                try:
                    pipe = client.pipeline(transaction=False)
                    for body in chunk:
                        pipe.xadd(streams.lifecycle, {"data": orjson.dumps(body)})
                    await pipe.execute()
                    break
                except (RedisError, OSError):
                    await asyncio.sleep(0.1)
            now = time.monotonic()
            for body in chunk:
                acked.setdefault(body["event_id"], now)
            await asyncio.sleep(0.05)

    async def subscriber() -> None:
        """A downstream reader of the results stream: what it saw before the kill."""
        last = "0-0"
        while not stop.is_set():
            try:
                reply: Any = await client.xread({streams.results: last}, count=1000, block=100)
            except (RedisError, OSError):
                await asyncio.sleep(0.1)
                continue
            for _s, rows in reply or []:
                for entry_id, fields in rows:
                    last = entry_id.decode()
                    seen.setdefault(orjson.loads(fields[b"data"])["causation_id"], last)

    async with running_worker(settings) as worker:

        async def watch() -> None:
            while not stop.is_set():
                if not readiness or readiness[-1][1] != worker.ready:
                    readiness.append((time.monotonic(), worker.ready))
                await asyncio.sleep(0.01)

        tasks = [asyncio.create_task(f()) for f in (publisher, subscriber, watch)]
        await asyncio.sleep(2.0)
        own_redis.kill()
        killed_at = time.monotonic()
        acked_before = {e for e, t in acked.items() if t < killed_at}
        seen_before = dict(seen)
        await asyncio.sleep(2.0)
        own_redis.start()
        restarted_at = time.monotonic()
        lifecycle: Any = await client.xrange(streams.lifecycle)
        surviving = {orjson.loads(f[b"data"])["event_id"] for _i, f in lifecycle}
        lost_commands = sorted(acked_before - surviving)
        lost_results = []
        for event_id, entry_id in seen_before.items():
            if not await client.xrange(streams.results, min=entry_id, max=entry_id):
                lost_results.append(event_id)
        await tasks[0]
        # Every command that survived gets exactly one result; a lost one leaves a seq gap in
        # its session, whose later commands go to the DLQ (seq_gap) after the gap timeout.
        final: Any = await client.xrange(streams.lifecycle)
        survivors = {orjson.loads(f[b"data"])["event_id"] for _i, f in final}
        deadline = time.monotonic() + 120
        while True:
            report = await audit(client, settings)
            accounted = len(report.per_command) + len(report.dead)
            if accounted >= len(survivors) and not await pending(client, settings):
                break
            assert time.monotonic() < deadline, f"{accounted} of {len(survivors)} accounted for"
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*tasks)
    await client.aclose()

    back = [t for t, ready in readiness if ready and t > restarted_at]
    went_down = [t for t, ready in readiness if not ready and t > killed_at]
    assert went_down, "the worker reported not-ready while Redis was down"
    assert back, "the worker became ready again by itself"
    dead_ids = {orjson.loads(orjson.loads(d["data"])["data"])["event_id"] for d in report.dead}
    assert report.duplicated == 0, "no command got a second result"
    unresolved = [e for e in survivors if e not in report.per_command and e not in dead_ids]
    assert unresolved == [], unresolved[:5]
    reissued = [e for e in lost_results if e in report.per_command]
    if own_redis.appendfsync == "always":
        assert lost_commands == [], "appendfsync always loses no acknowledged command"
    figures(
        f"redis_restart_{own_redis.appendfsync}",
        commands=len(bodies),
        acked_before_kill=len(acked_before),
        lost_commands=len(lost_commands),
        results_seen_before_kill=len(seen_before),
        lost_results=len(lost_results),
        lost_results_reissued=len(reissued),
        duplicated=report.duplicated,
        dead_letters=len(report.dead),
        not_ready_after_kill_s=round(went_down[0] - killed_at, 2),
        ready_after_restart_s=round(back[0] - restarted_at, 2),
    )
