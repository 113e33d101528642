"""A small tenant among big ones: recall@3 of a 50-episode project in a store of 100k episodes,
searched by the HNSW index (filtered after the scan, as before) and exactly below a size.

    .venv/bin/python bench/small_tenant_recall.py [--filler 100000] [--spread around|random]
        [--pgvector-url URL]

The tenant: the labeled set's 40 episodes (``tests/data/recall_set.json``) and 10 variants,
embedded by the local model; its 32 paraphrased queries. The filler: ``--filler`` episodes of
another project with vectors written directly (``tests.recall_set.add_filler``): ``around``
(default) moves each of the tenant's vectors by a random one (cosine ~0.5-0.95: other tenants
working on the same topics), ``random`` uses random directions. No Redis is needed.
recall@3: share of queries whose episode is in the top 3; "results" is the mean number of hits
of a ``limit=10`` recall (the tenant has 50 episodes, so 10 are always there to be found).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

from harness import fresh_database, markdown_table, percentile
from recall_common import pgvector_server
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.recall_set import add_filler, load_recall_set
from worker.db.engine import create_database_engine
from worker.db.vectors import VECTOR_TABLE, hnsw_index_sql
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.store import EpisodeStore, RecallMode
from worker.episodes.vector_search import EXACT_BELOW
from worker.episodes.vectorising import embed_and_store
from worker.settings import Settings
from worker.user_memory.memory import Memory

TENANT = "small"
USER: str | None = None
"""``--tenant user``: the tenant is user ``ann`` of the big project (``recall(user_id=)``), also
recalled through the user path, ``Memory.recall_scored(user_id=)`` (``alpha`` 1.0: vector,
0.5: hybrid); the big project's other episodes have no user."""


async def add_tenant(engine: AsyncEngine, embedder: LocalEmbedder) -> dict[str, str]:
    """The tenant's 50 episodes, embedded; key → episode id."""
    episodes, _queries = load_recall_set()
    rows = [(e.key, e.task, e.lessons) for e in episodes]
    rows += [(f"{e.key}-b", f"{e.task} (again)", e.lessons) for e in episodes[:10]]
    ids = {key: str(uuid.uuid4()) for key, _t, _l in rows}
    async with engine.begin() as conn:
        for key, task, lessons in rows:
            await conn.execute(
                text(
                    "INSERT INTO episodes (id, source_event_id, project_id, session_id, outcome,"
                    " task_description, lessons_learned, context_summary, importance_score,"
                    " occurred_at, announced_at, user_id) VALUES (CAST(:id AS uuid), :src, :p,"
                    " :s, 'success', :task, CAST(:lessons AS jsonb), '', 0.5, now(), now(), :u)"
                ),
                {
                    "id": ids[key],
                    "src": f"bench/{key}",
                    "p": TENANT,
                    "s": key,
                    "u": USER,
                    "task": task,
                    "lessons": __import__("json").dumps(lessons),
                },
            )
    await embed_and_store(engine, embedder, list(ids.values()))
    return ids


async def measure(
    recall: Callable[[str], Awaitable[list[str]]], ids: dict[str, str]
) -> tuple[float, float, float]:
    """recall@3, mean hits of a limit=10 recall, p50 ms; ``recall`` returns the ids found."""
    _episodes, queries = load_recall_set()
    found = 0
    counts: list[int] = []
    times: list[float] = []
    for q in queries:
        started = time.perf_counter()
        hits = await recall(q.query)
        times.append((time.perf_counter() - started) * 1000)
        found += ids[q.expect] in hits[:3]
        counts.append(len(hits))
    return found / len(queries), sum(counts) / len(counts), percentile(times, 50)


def by_store(store: EpisodeStore, mode: RecallMode) -> Callable[[str], Awaitable[list[str]]]:
    async def recall(query: str) -> list[str]:
        hits = await store.recall(TENANT, query, 10, mode=mode, user_id=USER)
        return [str(h.episode.id) for h in hits]

    return recall


def by_memory(memory: Memory, alpha: float) -> Callable[[str], Awaitable[list[str]]]:
    """The user path: ``Memory.recall_scored(user_id=USER)``."""

    async def recall(query: str) -> list[str]:
        hits = await memory.recall_scored(query, limit=10, user_id=USER, alpha=alpha)
        return [h.episode.id for h in hits]

    return recall


async def table_of(
    engine: AsyncEngine, embedder: LocalEmbedder, ids: dict[str, str], store_label: str
) -> list[list[object]]:
    rows: list[list[object]] = []
    for label, exact_below in (
        ("HNSW, filtered after the scan (before)", 0),
        ("exact below 10k (now)", EXACT_BELOW),
    ):
        store = EpisodeStore(engine, embedder, exact_below=exact_below)
        await store.recall(TENANT, "warm up", 10)
        for mode in ("vector", "hybrid"):
            at3, results, p50 = await measure(by_store(store, mode), ids)
            rows.append([store_label, label, mode, f"{at3:.2f}", f"{results:.1f}", f"{p50:.1f}"])
        if USER is None:
            continue
        settings = Settings(recall_exact_below=exact_below, stream_prefix="bench-small-tenant")
        async with Memory(TENANT, settings=settings, engine=engine, embedder=embedder) as memory:
            await memory.recall_scored("warm up", limit=10, user_id=USER)
            for mode, alpha in (("vector", 1.0), ("hybrid", 0.5)):
                at3, results, p50 = await measure(by_memory(memory, alpha), ids)
                path = f"{label}, `Memory.recall_scored`"
                rows.append([store_label, path, mode, f"{at3:.2f}", f"{results:.1f}", f"{p50:.1f}"])
    return rows


async def main(args: argparse.Namespace) -> None:
    embedder = LocalEmbedder()
    embedder.load()
    with pgvector_server(args.pgvector_url) as server:
        async with fresh_database(server) as url:
            engine = create_database_engine(url)
            try:
                ids = await add_tenant(engine, embedder)
                rows = await table_of(engine, embedder, ids, "tenant alone (50)")
                started = time.perf_counter()
                async with engine.begin() as conn:  # bulk load, then build the index once
                    await conn.execute(text(f"DROP INDEX IF EXISTS ix_{VECTOR_TABLE}_hnsw_384"))
                await add_filler(
                    engine,
                    TENANT if USER else "big",
                    args.filler,
                    model=embedder.name,
                    around=TENANT if args.spread == "around" else None,
                )
                async with engine.begin() as conn:
                    await conn.execute(text("SET maintenance_work_mem = '512MB'"))
                    await conn.execute(text(hnsw_index_sql(384)))
                    await conn.execute(text("ANALYZE"))
                built = time.perf_counter() - started
                total = args.filler + len(ids)
                rows += await table_of(engine, embedder, ids, f"among {total:,}")
            finally:
                await engine.dispose()
    tenant = f"user {USER} of project {TENANT}" if USER else f"project {TENANT}"
    print(f"tenant: {tenant}; filler: {args.filler:,} vectors ({args.spread}), loaded and")
    print(f"indexed in {built:.0f} s\n")
    print(
        markdown_table(
            ["store", "search", "mode", "recall@3", "results (of 10)", "p50 ms"],
            rows,
            "lllrrr",
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filler", type=int, default=100_000)
    parser.add_argument("--spread", choices=("around", "random"), default="around")
    parser.add_argument(
        "--tenant",
        choices=("project", "user"),
        default="project",
        help="project: a 50-episode project beside a big one; user: a 50-episode user of it",
    )
    parser.add_argument("--pgvector-url", default=None)
    arguments = parser.parse_args()
    if arguments.tenant == "user":
        TENANT, USER = "big", "ann"
    asyncio.run(main(arguments))
