"""Where ``Memory.remember``'s time goes with and without an indexer: each part of a remember
timed alone, on an embedded PostgreSQL with pgvector (or ``--pgvector-url``) and Redis.

    .venv/bin/python bench/remember_breakdown.py [--redis-url URL] [--pgvector-url URL] \\
        [--remembers 300]

Two projects of one database, same run: ``MEMWORKER_REMEMBER_EMBEDDING=indexer`` (``remember``
stores and announces) and ``inline`` (``remember`` embeds first: the indexer's read of the
turn's text, the model, the vector written with its ``episode.recallable``). The parts are
timed by wrapping the functions ``remember`` calls; the model's load is not timed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from harness import DEFAULT_REDIS_URL, cleanup, fresh_database, markdown_table, percentile
from recall_common import pgvector_server
from redis.asyncio import Redis

import worker.episodes.vectorising as vectorising
from worker.settings import Settings
from worker.user_memory import turns
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

WARM = 30
PARTS: dict[str, list[float]] = defaultdict(list)


def timed(name: str, call: Callable[..., Awaitable[Any]]) -> Any:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await call(*args, **kwargs)
        finally:
            PARTS[name].append(time.perf_counter() - started)

    return wrapper


def wrap(owner: object, attribute: str, name: str) -> None:
    setattr(owner, attribute, timed(name, getattr(owner, attribute)))


def turn(i: int) -> Episode:
    return Episode(
        id=f"t{i}",
        session_id=f"s{i // 20}",
        user_id=f"u{i % 50}",
        input="please book the vegan meal and a window seat on the lisbon flight",
        output="done: seat 14A, vegan meal requested",
    )


async def measure(settings: Settings, mode: str, count: int) -> None:
    mine = settings.model_copy(update={"remember_embedding": mode})
    async with Memory(f"breakdown-{mode}", settings=mine) as memory:
        for i in range(WARM):  # loads the model, warms the pools
            await memory.remember(turn(-1 - i))
        PARTS.clear()
        wrap(memory._publisher, "flush", "publish: the feed and the announcement, one pipeline")
        wrap(memory._turn_vectors, "remembered", "embed at remember, all of it")
        wrap(memory._settings_embedder(), "embed", "of which: the model, in a thread")
        for i in range(count):
            started = time.perf_counter()
            await memory.remember(turn(i))
            PARTS["remember, in all"].append(time.perf_counter() - started)


async def run(args: argparse.Namespace) -> str:
    redis = Redis.from_url(args.redis_url)
    prefix = "bench-remember-breakdown"
    unindexed, store_embedded = vectorising.unindexed, vectorising.store_embedded
    insert_pairs = turns.insert_pairs
    wrap(turns, "insert_pairs", "insert the turn and its owed event (one statement)")
    wrap(vectorising, "unindexed", "of which: read the turn's text (a SELECT)")
    wrap(vectorising, "store_embedded", "of which: write the vector and its event")
    rows: list[list[str]] = []
    try:
        with pgvector_server(args.pgvector_url) as server:
            async with fresh_database(server) as url:
                settings = Settings(
                    redis_url=args.redis_url, database_url=url, stream_prefix=prefix
                )
                for mode in ("indexer", "inline"):
                    await measure(settings, mode, args.remembers)
                    for part, samples in PARTS.items():
                        if not samples or (mode == "indexer" and "embed" in part):
                            continue
                        rows.append(
                            [
                                mode,
                                part,
                                f"{percentile(samples, 50) * 1000:,.2f} ms",
                                f"{percentile(samples, 99) * 1000:,.2f} ms",
                            ]
                        )
    finally:
        vectorising.unindexed, vectorising.store_embedded = unindexed, store_embedded
        turns.insert_pairs = insert_pairs
        await cleanup(redis, prefix)
        await redis.aclose()
    head = (
        f"Python {platform.python_version()} · {os.cpu_count()} CPUs · {args.remembers:,}"
        " remembers one at a time per mode"
    )
    return head + "\n\n" + markdown_table(["mode", "part", "p50", "p99"], rows, "llrr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--pgvector-url")
    parser.add_argument("--remembers", type=int, default=300)
    print(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
