"""Recall quality on the labeled set, and the local embedder's speed.

    python bench/recall_quality.py --redis-url redis://127.0.0.1:6379/0 [--pgvector-url URL]

The labeled set (``tests/data/recall_set.json``): 40 episodes, 32 queries paraphrasing one
episode each with no content word in common. recall@k = share of queries whose episode is in
the top k. Modes: full-text only, vector only, hybrid (``EpisodeStore.recall``'s default).
Embeddings/s: the 40 episodes' texts ×8, in batches of 64, after a warm-up; one query alone.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from harness import DEFAULT_REDIS_URL, cleanup, fresh_database, markdown_table, unique_prefix
from recall_common import pgvector_server
from redis.asyncio import Redis

from tests.recall_set import load_recall_set, remember_all
from worker.db.engine import create_database_engine
from worker.episodes.embedding import LocalEmbedder, episode_text
from worker.episodes.indexer import Indexer
from worker.episodes.store import EpisodeStore, RecallMode
from worker.settings import Settings

MODES: tuple[tuple[str, RecallMode], ...] = (
    ("full-text only", "text"),
    ("vector only", "vector"),
    ("hybrid (default)", "hybrid"),
)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--database-url", help="ignored: needs pgvector (--pgvector-url)")
    parser.add_argument("--pgvector-url")
    args = parser.parse_args()
    episodes, queries = load_recall_set()
    embedder = LocalEmbedder()
    started = time.perf_counter()
    embedder.load()
    load_s = time.perf_counter() - started
    texts = [episode_text(e.task, e.lessons, None) for e in episodes] * 8
    await embedder.embed(texts[:64])
    started = time.perf_counter()
    await embedder.embed(texts)
    per_s = len(texts) / (time.perf_counter() - started)
    singles = []
    for q in queries:
        started = time.perf_counter()
        await embedder.embed([q.query])
        singles.append(time.perf_counter() - started)
    singles.sort()
    print(
        markdown_table(
            [
                "embedder",
                "dimension",
                "model load",
                "embeddings/s (batches of 64)",
                "one query p50",
            ],
            [
                [
                    f"{embedder.name} (sentence-transformers, torch CPU)",
                    embedder.dimension,
                    f"{load_s:.1f} s",
                    f"{per_s:.0f}",
                    f"{singles[len(singles) // 2] * 1000:.1f} ms",
                ]
            ],
            "lrrrr",
        )
    )
    print()
    redis = Redis.from_url(args.redis_url)
    prefix = unique_prefix("recallq")
    settings = Settings(redis_url=args.redis_url, stream_prefix=prefix)
    try:
        with pgvector_server(args.pgvector_url) as server:
            async with fresh_database(server) as url:
                engine = create_database_engine(url)
                try:
                    ids = await remember_all(engine, redis, prefix, "bench", episodes)
                    indexer = Indexer(settings, redis, engine, embedder)
                    await indexer.run_once()
                    store = EpisodeStore(engine, embedder)
                    rows = []
                    for label, mode in MODES:
                        at = {1: 0, 3: 0, 10: 0}
                        for q in queries:
                            hits = await store.recall("bench", q.query, 10, mode=mode)
                            found = [str(h.episode.id) for h in hits]
                            for k in at:
                                at[k] += ids[q.expect] in found[:k]
                        rows.append([label, *(f"{at[k] / len(queries):.2f}" for k in at)])
                finally:
                    await engine.dispose()
        print(f"{len(episodes)} episodes, {len(queries)} paraphrased queries (no shared word).")
        print()
        print(markdown_table(["ranking", "recall@1", "recall@3", "recall@10"], rows, "lrrr"))
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
