"""Forgetting a project of 10,000 finished sessions beside another of the same size: how long
``memworker forget`` takes (the same ``forget_everywhere`` the CLI and ``EpisodeStore.forget``
run) and what it removes, with the other project's data left whole.

    .venv/bin/python bench/forget.py [--sessions 10000] [--redis-url URL] [--database-url URL]

Each project's sessions are ``agent.terminated`` results (a realistic snapshot each) consolidated
into a fresh database (created, migrated, dropped) under their own stream prefix, so the streams
hold their results and ``P:episodes`` their announcements, as after a real run.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from consolidation_throughput import terminated_result
from harness import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, cleanup, fresh_database, unique_prefix
from sqlalchemy import text

from worker.connections import redis_client
from worker.consolidation.consolidator import Consolidator
from worker.consumers.groups import ensure_group
from worker.db.engine import create_database_engine
from worker.erasure.forget import forget_everywhere
from worker.keys import CONSOLIDATION_GROUP, StreamKeys
from worker.logs import configure_logging
from worker.settings import Settings


def result_of(project: str, i: int) -> dict[str, Any]:
    body = terminated_result(i)
    body["project_id"] = project
    return body


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--sessions", type=int, default=10_000)
    args = parser.parse_args()
    configure_logging("WARNING")
    prefix = unique_prefix("forget")
    redis = redis_client(args.redis_url)
    results = StreamKeys(prefix, 0).results
    try:
        async with fresh_database(args.database_url) as url:
            settings = Settings(redis_url=args.redis_url, database_url=url, stream_prefix=prefix)
            engine = create_database_engine(url)
            await ensure_group(redis, results, CONSOLIDATION_GROUP)
            pipe = redis.pipeline(transaction=False)
            for i in range(args.sessions):
                for project in ("forgotten", "kept"):
                    pipe.xadd(results, {"data": orjson.dumps(result_of(project, i))})
                if i % 500 == 499:
                    await pipe.execute()
            await pipe.execute()
            consolidator = Consolidator(settings, redis, engine, relay_grace_s=0.0)
            while await consolidator.run_once():
                pass
            await consolidator.relay(max_batches=1_000)
            started = time.perf_counter()
            receipt = await forget_everywhere(engine, redis, prefix, "forgotten", shards=1)
            elapsed = time.perf_counter() - started
            async with engine.connect() as conn:
                left = await conn.scalar(
                    text("SELECT count(*) FROM episodes WHERE project_id = 'forgotten'")
                )
                kept = await conn.scalar(
                    text("SELECT count(*) FROM episodes WHERE project_id = 'kept'")
                )
            await engine.dispose()
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    print(f"{args.sessions:,} finished sessions forgotten beside {args.sessions:,} kept")
    print()
    print("| what | figure |")
    print("|---|---:|")
    print(f"| forget, wall time | {elapsed:.2f} s |")
    print(f"| sessions per second | {args.sessions / elapsed:,.0f} |")
    print(f"| episodes of the forgotten project left | {left} |")
    print(f"| episodes of the other project kept | {kept:,} |")
    print()
    print("Receipt: " + orjson.dumps(receipt.counts()).decode())


if __name__ == "__main__":
    asyncio.run(main())
