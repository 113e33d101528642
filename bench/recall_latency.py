"""Recall latency (query embedding included) at 10,000 and 100,000 episodes in one project.

    python bench/recall_latency.py --redis-url redis://127.0.0.1:6379/0 [--pgvector-url URL] \\
        --sizes 10000 100000 --queries 200

The population is generated in SQL (fast): episodes with tasks of 8 words drawn from the
labeled set's vocabulary, and random 384-dimension vectors inserted directly (the HNSW index is
built after the load). The labeled set's 40 episodes are remembered and embedded for real, so
the 32 labeled queries have their answers among the synthetic ones: recall@3 at each size is
shown too. Every timed call is ``EpisodeStore.recall(project, query, 10)``: the query is
embedded by the local model, then the vector search, the full-text search and the fusion run.

``--breakdown`` also times, per query, each part of a recall alone (the query's embedding, the
vector search, the full-text search with its cap (``episodes.text_search``) and with every match
ranked as before the cap, the fusion, loading the chosen episodes) and a whole recall with every
match ranked (``text_cap=None``), interleaved with the default one so both meet the same load.
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

from tests.recall_set import LabeledQuery, load_recall_set, remember_all
from worker.db.engine import create_database_engine
from worker.db.vectors import VECTOR_TABLE, hnsw_index_sql
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.episodes.ranking import DEFAULT_WEIGHTS, fuse
from worker.episodes.store import EpisodeStore, _episode_filters
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


PARTS = (
    "query embedding",
    "vector search",
    "full-text search (now: capped above 10,000 episodes)",
    "full-text search, every match ranked (before)",
    "fusion",
    "load the chosen 10 (+ their similarity)",
)


async def breakdown(
    store: EpisodeStore, uncapped: EpisodeStore, queries: list[LabeledQuery], count: int
) -> dict[str, list[float]]:
    """Seconds per part of a recall (``PARTS``), each timed alone, ``count`` queries."""
    assert store.embedder is not None
    filters = _episode_filters(PROJECT, None, None, None, None, None, None, None)
    scope = (PROJECT, None, None, None, None, None, None, None)
    n = DEFAULT_WEIGHTS.candidates
    times: dict[str, list[float]] = {part: [] for part in PARTS}

    def lap(part: str, started: float) -> float:
        now = time.perf_counter()
        times[part].append(now - started)
        return now

    for i in range(count):
        query = queries[i % len(queries)].query
        t = time.perf_counter()
        [vector] = await store.embedder.embed([query])
        t = lap(PARTS[0], t)
        nearest = await store.vectors.nearest(PROJECT, vector, filters, n, scope)
        t = lap(PARTS[1], t)
        texts = await store._text_candidates(query, filters, n, scope)
        t = lap(PARTS[2], t)
        await uncapped._text_candidates(query, filters, n, scope)
        t = lap(PARTS[3], t)
        found = [nearest.candidates, [c for c, _rank in texts]]
        candidates = {c.episode_id: c for ranked in found for c in ranked}
        best = fuse([[c.episode_id for c in r] for r in found], candidates, DEFAULT_WEIGHTS)[:10]
        t = lap(PARTS[4], t)
        similarity = dict(nearest.similarity)
        await store._load_best(PROJECT, [b[0] for b in best], list(vector), similarity)
        lap(PARTS[5], t)
    return times


def ms(samples: list[float], q: float) -> str:
    return f"{percentile(samples, q) * 1000:.1f} ms"


async def recall_at_3(
    store: EpisodeStore, queries: list[LabeledQuery], ids: dict[str, str]
) -> float:
    found = 0
    for q in queries:
        top = await store.recall(PROJECT, q.query, 3)
        found += ids[q.expect] in [str(h.episode.id) for h in top]
    return found / len(queries)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--database-url", help="ignored: needs pgvector (--pgvector-url)")
    parser.add_argument("--pgvector-url")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time each part of a recall, and recall with every text match ranked (before)",
    )
    args = parser.parse_args()
    episodes, queries = load_recall_set()
    words = sorted({w for e in episodes for w in re.findall(r"[a-z]+", e.task.lower())})
    embedder = LocalEmbedder()
    embedder.load()
    redis = Redis.from_url(args.redis_url)
    prefix = "bench-recall-latency"
    settings = Settings(redis_url=args.redis_url, stream_prefix=prefix)
    rows: list[list[object]] = []
    parts: list[list[object]] = []
    try:
        with pgvector_server(args.pgvector_url) as server:
            async with fresh_database(server) as url:
                engine = create_database_engine(url)
                try:
                    ids = await remember_all(engine, redis, prefix, PROJECT, episodes)
                    await Indexer(settings, redis, engine, embedder).run_once()
                    store = EpisodeStore(engine, embedder)
                    uncapped = EpisodeStore(engine, embedder, text_cap=None)
                    have = 0
                    for size in sorted(args.sizes):
                        started = time.perf_counter()
                        await grow(engine, have + 1, size - len(episodes), words)
                        load_s = time.perf_counter() - started
                        have = size - len(episodes)
                        variants = [("", store)]
                        if args.breakdown:
                            variants.append((" (every text match ranked: before)", uncapped))
                        for _label, each in variants:
                            for q in queries[:5]:  # warm-up
                                await each.recall(PROJECT, q.query, 10)
                        samples: dict[str, list[float]] = {label: [] for label, _s in variants}
                        for n in range(args.queries):
                            q = queries[n % len(queries)]
                            for label, each in variants:  # interleaved: the same load for each
                                started = time.perf_counter()
                                await each.recall(PROJECT, q.query, 10)
                                samples[label].append(time.perf_counter() - started)
                        for label, each in variants:
                            rows.append(
                                [
                                    f"{size:,}{label}",
                                    f"{load_s:.0f} s",
                                    ms(samples[label], 50),
                                    ms(samples[label], 99),
                                    f"{await recall_at_3(each, queries, ids):.2f}",
                                ]
                            )
                        if args.breakdown:
                            times = await breakdown(store, uncapped, queries, args.queries)
                            for part in PARTS:
                                parts.append(
                                    [f"{size:,}", part, ms(times[part], 50), ms(times[part], 99)]
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
    if parts:
        print()
        print(f"Each part of a recall timed alone, {args.queries} queries per size:")
        print()
        print(markdown_table(["episodes", "part", "p50", "p99"], parts, "rlrr"))


if __name__ == "__main__":
    asyncio.run(main())
