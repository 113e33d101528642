"""Indexer episodes/s, and consolidation episodes/s before and after the indexer runs.

    python bench/indexer_throughput.py --redis-url redis://127.0.0.1:6379/0 \\
        [--pgvector-url URL] --episodes 3000 --rounds 2

Each round, on a fresh database with pgvector (the embedded pgserver unless ``--pgvector-url``):

- **before**: the Consolidator drains a prefilled results stream of ``--episodes``
  ``agent.terminated`` results (those of ``bench/consolidation_throughput.py``), alone.
- **after**: the same, while ``memworker index`` (a subprocess, as in production) embeds the
  episodes the consolidator announces, at the same time on the same machine.
- **indexer**: episodes/s of the indexer draining the ``before`` run's announcements
  (in-process: read, embed with the local model, upsert), with nothing else running.

Rounds alternate before and after, so both see the same (noisy, shared) machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid

from consolidation_throughput import prefill
from harness import DEFAULT_REDIS_URL, cleanup, fresh_database, markdown_table
from recall_common import pgvector_server
from redis.asyncio import Redis
from sqlalchemy import text

from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.keys import StreamKeys
from worker.settings import Settings


async def vectors(url: str) -> int:
    engine = create_database_engine(url, pool=False)
    try:
        async with engine.connect() as conn:
            return int(
                (await conn.execute(text("SELECT count(*) FROM episode_embeddings"))).scalar_one()
            )
    finally:
        await engine.dispose()


async def one_round(
    args: argparse.Namespace, redis: Redis, server: str, embedder: LocalEmbedder, with_indexer: bool
) -> tuple[float, float | None]:
    """Consolidation episodes/s, and (without the indexer subprocess) indexer episodes/s."""
    async with fresh_database(server) as url:
        prefix = "bench" + uuid.uuid4().hex[:8]
        settings = Settings(redis_url=args.redis_url, database_url=url, stream_prefix=prefix)
        engine = create_database_engine(url)
        indexer_process = None
        try:
            await prefill(redis, StreamKeys(prefix, 0).results, args.episodes)
            if with_indexer:
                env = dict(
                    os.environ,
                    REDIS_URL=args.redis_url,
                    DATABASE_URL=url,
                    MEMWORKER_STREAM_PREFIX=prefix,
                    MEMWORKER_LOG_LEVEL="WARNING",
                )
                indexer_process = subprocess.Popen(
                    [sys.executable, "-m", "worker.cli", "index"], env=env
                )
                await asyncio.sleep(8)  # the model is loaded before the clock starts
            started = time.perf_counter()
            done = await Consolidator(settings, redis, engine).run_once()
            consolidation = done / (time.perf_counter() - started)
            if with_indexer:
                return consolidation, None
            indexer = Indexer(settings, redis, engine, embedder)
            started = time.perf_counter()
            await indexer.run_once()
            indexed = await vectors(url)
            assert indexed == args.episodes, (indexed, args.episodes)
            return consolidation, indexed / (time.perf_counter() - started)
        finally:
            if indexer_process is not None:
                indexer_process.terminate()
                indexer_process.wait()
            await engine.dispose()
            await cleanup(redis, prefix)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--database-url", help="ignored: needs pgvector (--pgvector-url)")
    parser.add_argument("--pgvector-url")
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    embedder = LocalEmbedder()
    embedder.load()
    redis = Redis.from_url(args.redis_url)
    before: list[float] = []
    after: list[float] = []
    indexer: list[float] = []
    try:
        with pgvector_server(args.pgvector_url) as server:
            for _ in range(args.rounds):
                consolidation, indexed = await one_round(args, redis, server, embedder, False)
                before.append(consolidation)
                if indexed is not None:
                    indexer.append(indexed)
                consolidation, _ = await one_round(args, redis, server, embedder, True)
                after.append(consolidation)
    finally:
        await redis.aclose()

    def cell(rates: list[float]) -> str:
        spread = f" ({min(rates):,.0f}–{max(rates):,.0f})" if len(rates) > 1 else ""
        return f"**{statistics.median(rates):,.0f}**{spread}"

    print(f"{args.episodes:,} episodes a run, {args.rounds} rounds alternating; median (min–max).")
    print()
    rows = [
        ["consolidation, indexer not running (before)", cell(before)],
        ["consolidation, `memworker index` running alongside (after)", cell(after)],
        ["indexer alone (local all-MiniLM-L6-v2, batches of 64)", cell(indexer)],
    ]
    print(markdown_table(["run", "episodes/s"], rows, "lr"))
    ratio = statistics.median(after) / statistics.median(before)
    print()
    print(f"Consolidation after / before: {ratio:.2f}.")


if __name__ == "__main__":
    asyncio.run(main())
