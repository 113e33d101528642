"""Consolidation throughput: the batched Consolidator next to a naive per-row-commit loop.

    python bench/consolidation_throughput.py --redis-url redis://127.0.0.1:6379/0 \\
        --database-url postgresql://postgres@127.0.0.1:5432/postgres --episodes 20000

Each run uses a fresh database (created and dropped) and its own stream prefix. Every result is
an ``agent.terminated`` with ``consolidate: true`` and a realistic snapshot (20 variables, 30
scratchpad steps, a task state, checkpoints), so every entry becomes an episode row and a
lifecycle event row.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy import make_url, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from worker.connections import redis_client
from worker.consolidator import (
    Consolidator,
    ParsedResult,
    StreamEntry,
    decode_entry,
    episode_row,
    event_row,
    parse_result,
)
from worker.db.engine import asyncpg_url, create_database_engine
from worker.db.models import Episode, LifecycleEvent
from worker.keys import CONSOLIDATION_GROUP, StreamKeys
from worker.migrate import migrate
from worker.settings import Settings


def terminated_result(i: int) -> dict[str, Any]:
    stamp = f"2025-01-01T00:{(i // 60) % 60:02d}:{i % 60:02d}Z"
    return {
        "event_id": f"r-{uuid.uuid4().hex}",
        "type": "agent.terminated",
        "causation_id": uuid.uuid4().hex,
        "command": "terminate",
        "project_id": f"proj-{i % 10}",
        "session_id": f"sess-{i}",
        "agent_instance_id": f"agent-{i}",
        "agent_type_id": "researcher",
        "seq": 7,
        "correlation_id": None,
        "metadata": {"run": "bench"},
        "occurred_at": stamp,
        "duration_ms": 0.8,
        "outcome": "success" if i % 4 else "failure",
        "items_cleared": 52,
        "consolidate": True,
        "task_description": f"Summarise quarterly report {i} and flag anomalies in the totals",
        "lessons_learned": ["check currency units first", "totals lag the detail by a day"],
        "tokens_used": 12_000 + i,
        "importance": 0.6,
        "started_at": "2025-01-01T00:00:00Z",
        "duration_seconds": 95.5,
        "snapshot": {
            "variables": {f"var_{k}": {"value": k, "text": "lorem ipsum " * 4} for k in range(20)},
            "task_state": {
                "description": "reading sources",
                "current_step": 4,
                "total_steps": 6,
                "status": "in_progress",
                "progress": 66.0,
                "started_at": "2025-01-01T00:00:00Z",
                "updated_at": stamp,
                "data": {"sources": 12},
            },
            "scratchpad": [
                {"content": f"step {k}: read source {k}, found nothing odd", "timestamp": stamp}
                for k in range(30)
            ],
            "checkpoints": ["cp-1", "cp-2"],
        },
    }


async def prefill(redis: Redis, stream: str, count: int, first: int = 0) -> None:
    await redis.xgroup_create(stream, CONSOLIDATION_GROUP, id="0", mkstream=True)
    pipe = redis.pipeline(transaction=False)
    for i in range(first, first + count):
        pipe.xadd(stream, {"data": orjson.dumps(terminated_result(i))})
        if i % 1000 == 999:
            await pipe.execute()
    await pipe.execute()


async def naive(settings: Settings, redis: Redis, engine: AsyncEngine, stream: str) -> int:
    """One entry at a time: read, parse, INSERT both rows, COMMIT, XACK."""
    done = 0
    while True:
        reply: Any = await redis.xreadgroup(CONSOLIDATION_GROUP, "naive", {stream: ">"}, count=1)
        if not reply:
            return done
        entry_id, fields = reply[0][1][0]
        entry = StreamEntry(stream, entry_id.decode(), {k.decode(): v for k, v in fields.items()})
        payload = decode_entry(entry.fields)
        parsed = ParsedResult(entry, payload, parse_result(payload))
        async with engine.begin() as conn:
            await conn.execute(insert(LifecycleEvent).on_conflict_do_nothing(), [event_row(parsed)])
            await conn.execute(
                insert(Episode).on_conflict_do_nothing(),
                [episode_row(parsed, settings.context_summary_max_chars)],
            )
        await redis.xack(stream, CONSOLIDATION_GROUP, entry.entry_id)
        done += 1


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--episodes", type=int, default=20_000)
    parser.add_argument("--naive-episodes", type=int, default=2_000)
    parser.add_argument("--batch-size", type=int, default=500)
    args = parser.parse_args()

    admin_url = asyncpg_url(args.database_url)
    name = "memworker_bench_" + uuid.uuid4().hex[:8]
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    prefix = "bench" + uuid.uuid4().hex[:8]
    settings = Settings(
        redis_url=args.redis_url,
        database_url=url,
        stream_prefix=prefix,
        consolidation_batch_size=args.batch_size,
    )
    redis = redis_client(args.redis_url)  # as the consolidator gets it in production
    engine = create_database_engine(url)
    try:
        await migrate(url)
        rows: list[tuple[str, int, float]] = []

        stream = StreamKeys(prefix, 0).results
        await prefill(redis, stream, args.episodes)
        started = time.perf_counter()
        finished = await Consolidator(settings, redis, engine).run_once()
        rows.append(
            (f"Consolidator (batch {args.batch_size})", finished, time.perf_counter() - started)
        )

        naive_stream = f"{prefix}:naive"
        await prefill(redis, naive_stream, args.naive_episodes, first=args.episodes)
        started = time.perf_counter()
        finished = await naive(settings, redis, engine, naive_stream)
        rows.append(("naive: one COMMIT + XACK per entry", finished, time.perf_counter() - started))

        async with engine.connect() as conn:
            stored = (await conn.execute(text("SELECT count(*) FROM episodes"))).scalar_one()
        assert stored == args.episodes + args.naive_episodes, stored

        rates = [n / s for _label, n, s in rows]
        print(f"\n{args.episodes:,} + {args.naive_episodes:,} terminated results with snapshots\n")
        print("| implementation | episodes | seconds | episodes/s |")
        print("|---|---:|---:|---:|")
        for (label, n, seconds), rate in zip(rows, rates, strict=True):
            print(f"| {label} | {n:,} | {seconds:.2f} | {rate:,.0f} |")
        print(f"\nbatched / naive: **{rates[0] / rates[1]:.1f}×**")
    finally:
        await engine.dispose()
        keys = [k async for k in redis.scan_iter(match=f"{prefix}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


if __name__ == "__main__":
    asyncio.run(main())
