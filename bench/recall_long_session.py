"""One recall's cost when a user's turns are one long session of words that match most of them:
the worst case of ``bench/user_memory_load.py``'s mixed points, alone on the machine.

    python bench/recall_long_session.py [--turns 1000,3000] [--recalls 40]

For each size: a throw-away database, one user with that many turns in one session (the load
bench's turns: 12 words of a 32-word vocabulary), then ``Memory.recall`` of three of those
words, one call after another (words only: no vectors, as in the load bench). Wall time and
this process's CPU a recall (Postgres's not included) say how many recalls a second two cores
could answer beside the writes, whatever the queueing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from harness import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    cleanup,
    fresh_database,
    invocation,
    markdown_table,
    percentile,
    unique_prefix,
)
from redis.asyncio import Redis
from user_memory_load import turn, words

from worker.settings import Settings
from worker.user_memory.memory import Memory


async def size(turns: int, recalls: int, redis_url: str, database_url: str) -> list[str]:
    prefix = unique_prefix("long-session")
    redis = Redis.from_url(redis_url)
    try:
        async with fresh_database(database_url) as url:
            settings = Settings(redis_url=redis_url, database_url=url, stream_prefix=prefix)
            walls, cpus = await timed(settings, turns, recalls)
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    return [
        f"{turns:,}",
        f"{percentile(walls, 50) * 1000:.1f}",
        f"{percentile(walls, 99) * 1000:.1f}",
        f"{sum(cpus) / len(cpus) * 1000:.1f}",
    ]


async def timed(settings: Settings, turns: int, recalls: int) -> tuple[list[float], list[float]]:
    """Remember ``turns`` turns of one user's one session, then time ``recalls`` recalls."""
    async with Memory("bench", settings=settings) as memory:
        for start in range(0, turns, 1_000):
            end = min(turns, start + 1_000)
            await memory.remember_many([turn("t", 0, n) for n in range(start, end)])
        for n in range(5):  # warm-up: the statements prepared, the caches filled
            await memory.recall(words(0, -n, 3), user_id="u0")
        walls, cpus = [], []
        for n in range(recalls):
            cpu, wall = time.process_time(), time.perf_counter()
            await memory.recall(words(0, -n - 10, 3), user_id="u0")
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    return walls, cpus


async def run(args: argparse.Namespace) -> str:
    os.environ.setdefault("MEMWORKER_REMEMBER_EMBEDDING", "indexer")  # words only, no model
    rows = [
        await size(int(n), args.recalls, args.redis_url, args.database_url)
        for n in args.turns.split(",")
    ]
    load = os.getloadavg()[0]
    header = ["turns in the session", "recall p50 ms", "recall p99 ms", "Python CPU ms a recall"]
    return f"`{invocation()}`; load average {load:.1f} at the end\n\n" + markdown_table(
        header, rows, "rrrr"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--turns", default="1000,3000")
    parser.add_argument("--recalls", type=int, default=40)
    print(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
