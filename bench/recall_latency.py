"""Recall latency (query embedding included) at 10,000 and 100,000 episodes in one project.

    python bench/recall_latency.py --redis-url redis://127.0.0.1:6379/0 [--pgvector-url URL] \\
        --sizes 10000 100000 --queries 200

The population is generated in SQL (fast): episodes with tasks of 8 words drawn from the
labeled set's vocabulary, and random 384-dimension vectors inserted directly (the HNSW index is
built after the load). The labeled set's 40 episodes are remembered and embedded for real, so
the 32 labeled queries have their answers among the synthetic ones: recall@3 at each size is
shown too. Every timed call is ``EpisodeStore.recall(project, query, 10)``: the query is
embedded by the local model, then the vector search, the full-text search and the fusion run.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time

from harness import DEFAULT_REDIS_URL, cleanup, fresh_database, markdown_table, percentile
from recall_common import pgvector_server
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.recall_set import load_recall_set, remember_all
from worker.db.engine import create_database_engine
from worker.db.vectors import VECTOR_TABLE, hnsw_index_sql
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.episodes.store import EpisodeStore
from worker.settings import LOCAL_EMBEDDING_DIMENSION, LOCAL_EMBEDDING_MODEL, Settings

PROJECT = "bench"


async def grow(engine: AsyncEngine, first: int, last: int, words: list[str]) -> None:
    """Synthetic episodes ``first``..``last`` (and their random vectors) in ``PROJECT``."""
    dim = LOCAL_EMBEDDING_DIMENSION
    async with engine.begin() as conn:
        await conn.execute(text(f"DROP INDEX IF EXISTS ix_{VECTOR_TABLE}_hnsw_{dim}"))
        await conn.execute(
            text(
                "INSERT INTO episodes (id, source_event_id, project_id, session_id,"
                " task_description, outcome, lessons_learned, context_summary, importance_score,"
                " occurred_at)"
                " SELECT gen_random_uuid(), 'syn-' || i, :project, 'syn-' || i,"
                " array_to_string(array(SELECT (CAST(:words AS text[]))"
                "   [1 + floor(random() * :n)::int] FROM generate_series(1, 8) WHERE i > 0), ' '),"
                " 'success', '[]'::jsonb, '', random(), now() - i * interval '1 minute'"
                " FROM generate_series(CAST(:first AS int), CAST(:last AS int)) AS i"
            ),
            {"project": PROJECT, "words": words, "n": len(words), "first": first, "last": last},
        )
        await conn.execute(
            text(
                f"INSERT INTO {VECTOR_TABLE} (episode_id, project_id, model, dimension, embedding)"
                f" SELECT e.id, e.project_id, :model, {dim},"
                f" CAST(array(SELECT random() - 0.5 FROM generate_series(1, {dim})"
                "   WHERE e.id IS NOT NULL) AS vector)"
                " FROM episodes e WHERE e.source_event_id LIKE 'syn-%'"
                f" AND NOT EXISTS (SELECT 1 FROM {VECTOR_TABLE} v WHERE v.episode_id = e.id)"
            ),
            {"model": LOCAL_EMBEDDING_MODEL},
        )
        await conn.execute(text("SET LOCAL maintenance_work_mem = '1GB'"))
        await conn.execute(text(hnsw_index_sql(dim)))
        await conn.execute(text("ANALYZE episodes"))
        await conn.execute(text(f"ANALYZE {VECTOR_TABLE}"))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--database-url", help="ignored: needs pgvector (--pgvector-url)")
    parser.add_argument("--pgvector-url")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    episodes, queries = load_recall_set()
    words = sorted({w for e in episodes for w in re.findall(r"[a-z]+", e.task.lower())})
    embedder = LocalEmbedder()
    embedder.load()
    redis = Redis.from_url(args.redis_url)
    prefix = "bench-recall-latency"
    settings = Settings(redis_url=args.redis_url, stream_prefix=prefix)
    rows = []
    try:
        with pgvector_server(args.pgvector_url) as server:
            async with fresh_database(server) as url:
                engine = create_database_engine(url)
                try:
                    ids = await remember_all(engine, redis, prefix, PROJECT, episodes)
                    await Indexer(settings, redis, engine, embedder).run_once()
                    store = EpisodeStore(engine, embedder)
                    have = 0
                    for size in sorted(args.sizes):
                        started = time.perf_counter()
                        await grow(engine, have + 1, size - len(episodes), words)
                        load_s = time.perf_counter() - started
                        have = size - len(episodes)
                        for q in queries[:5]:  # warm-up
                            await store.recall(PROJECT, q.query, 10)
                        samples = []
                        for n in range(args.queries):
                            q = queries[n % len(queries)]
                            started = time.perf_counter()
                            await store.recall(PROJECT, q.query, 10)
                            samples.append(time.perf_counter() - started)
                        found = 0
                        for q in queries:
                            top = await store.recall(PROJECT, q.query, 3)
                            found += ids[q.expect] in [str(h.episode.id) for h in top]
                        rows.append(
                            [
                                f"{size:,}",
                                f"{load_s:.0f} s",
                                f"{percentile(samples, 50) * 1000:.1f} ms",
                                f"{percentile(samples, 99) * 1000:.1f} ms",
                                f"{found / len(queries):.2f}",
                            ]
                        )
                finally:
                    await engine.dispose()
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    print(f"{args.queries} recalls (limit 10) per size, one at a time; the labeled queries.")
    print()
    header = ["episodes in the project", "load + HNSW build", "p50", "p99", "labeled recall@3"]
    print(markdown_table(header, rows, "rrrrr"))


if __name__ == "__main__":
    asyncio.run(main())
