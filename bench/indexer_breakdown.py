"""Where a round of the indexer's time goes, and the floor of its rate on this machine.

    python bench/indexer_breakdown.py --redis-url redis://127.0.0.1:6379/0 --episodes 3000 \\
        --rounds 2

Per round (a fresh database with pgvector, ``--episodes`` results consolidated, then
``Indexer.run_once`` draining their announcements end to end): the wall seconds inside each
step (they overlap where the indexer overlaps them: the embedding runs in a thread while the
previous batch is written), the CPU seconds of the indexer's process and of Postgres, and the
rate those CPU seconds allow on this machine's cores.

Then, in isolation on the same rows: the embedding alone (``embed_sync`` in the indexer's
batches, nothing else running) and ``store_vectors`` alone (the same vectors and batches into
an empty table, with its HNSW index and without): their sum is what one episode costs at
least, whatever overlaps; as a rate, the floor.

Written against the step names of the indexer before and after #25's throughput work, so the
same command measures an earlier checkout (``PYTHONPATH=<checkout>``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psutil
from consolidation_throughput import prefill
from harness import DEFAULT_REDIS_URL, cleanup, fresh_database, markdown_table
from recall_common import pgvector_server
from redis.asyncio import Redis
from sqlalchemy import text

from worker.consolidation.consolidator import Consolidator
from worker.consumers import loop as consumer_loop
from worker.db.engine import create_database_engine
from worker.episodes import indexer as indexer_module
from worker.episodes.embedding import LocalEmbedder
from worker.keys import StreamKeys
from worker.settings import Settings


def _vectorising() -> Any:
    """Where the indexer's Postgres steps live: ``worker.episodes.vectorising``, or the
    indexer's module in a checkout before it was split off."""
    try:
        return importlib.import_module("worker.episodes.vectorising")
    except ImportError:
        return indexer_module


STEPS = {  # label: (module or class, attribute, as the caller looks it up), if the checkout has it
    "read announcements (XREADGROUP)": (consumer_loop.GroupConsumer, "_read_from"),
    "acknowledge (XACK)": (consumer_loop.GroupConsumer, "ack"),
    "read the episodes' rows (SELECT)": (indexer_module, "unindexed"),
    "store_vectors (INSERT into HNSW)": (_vectorising(), "store_vectors"),
    "owe episode.recallable (INSERT)": (_vectorising(), "owe_many"),
    "publish episode.recallable": (indexer_module, "publish_owed_many"),
    "publish episode.recallable ": (indexer_module, "publish_owed"),  # before #25's change
}
seconds: collections.defaultdict[str, float] = collections.defaultdict(float)


def timed_async(owner: Any, name: str, label: str) -> None:
    inner = getattr(owner, name)

    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await inner(*args, **kwargs)
        finally:
            seconds[label.strip()] += time.perf_counter() - started

    setattr(owner, name, timed)


class TimedSession:
    """The ONNX Runtime session, its ``run`` timed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def run(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.inner.run(*args, **kwargs)
        finally:
            seconds["embed: ONNX Runtime run (thread)"] += time.perf_counter() - started


def embedder() -> LocalEmbedder:
    try:
        local = LocalEmbedder(runtime="onnx", spinning=False)  # as the indexer builds it
    except TypeError:  # a checkout before spinning was a choice
        local = LocalEmbedder(runtime="onnx")
    local.load()
    backend: Any = local.backend
    backend._session = TimedSession(backend._session)
    inner = local.embed_sync

    def embed_sync(texts: Any) -> list[list[float]]:
        started = time.perf_counter()
        try:
            return inner(texts)
        finally:
            seconds["embed: embed_sync, tokens and run (thread)"] += time.perf_counter() - started

    local.embed_sync = embed_sync  # type: ignore[method-assign]
    return local


def postgres_cpu(data_marker: str) -> float:
    """CPU seconds of the embedded Postgres (its postmaster, children alive and exited)."""
    total = 0.0
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            if process.info["name"] != "postgres" or not any(
                data_marker in part for part in process.info["cmdline"] or []
            ):
                continue
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
            for child in process.children(recursive=True):
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
        except psutil.Error:
            continue
    return total


def own_cpu() -> float:
    times = os.times()
    return times.user + times.system


async def one_round(
    args: argparse.Namespace, redis: Redis, server: str, local: LocalEmbedder
) -> dict[str, Any]:
    async with fresh_database(server) as url:
        prefix = "bench" + uuid.uuid4().hex[:8]
        settings = Settings(
            redis_url=args.redis_url,
            database_url=url,
            stream_prefix=prefix,
            index_batch_size=args.batch_size,
        )
        engine = create_database_engine(url)
        try:
            await prefill(redis, StreamKeys(prefix, 0).results, args.episodes)
            await Consolidator(settings, redis, engine).run_once()
            indexer = indexer_module.Indexer(settings, redis, engine, local)
            seconds.clear()
            cpu, pg = own_cpu(), postgres_cpu(args.data_marker)
            started = time.perf_counter()
            await indexer.run_once()
            wall = time.perf_counter() - started
            cpu, pg = own_cpu() - cpu, postgres_cpu(args.data_marker) - pg
            steps = dict(seconds)
            async with engine.connect() as conn:
                rows = (
                    await conn.execute(
                        text(
                            "SELECT id::text AS id, task_description, lessons_learned,"
                            " context_summary FROM episodes ORDER BY id"
                        )
                    )
                ).all()
            isolated = await isolated_costs(engine, local, list(rows), args.batch_size)
            return {"wall": wall, "cpu": cpu, "pg": pg, "steps": steps, **isolated}
        finally:
            await engine.dispose()
            await cleanup(redis, prefix)


async def isolated_costs(
    engine: Any, local: LocalEmbedder, rows: list[Any], batch_size: int
) -> dict[str, float]:
    """The embedding alone and ``store_vectors`` alone (with and without HNSW), same batches."""
    from worker.db.vectors import store_vectors
    from worker.episodes.embedding import episode_text

    texts = [
        episode_text(r.task_description, r.lessons_learned or [], r.context_summary) for r in rows
    ]
    ids = [r.id for r in rows]
    cpu, started = own_cpu(), time.perf_counter()
    vectors: list[list[float]] = []
    for i in range(0, len(texts), batch_size):
        vectors.extend(local.embed_sync(texts[i : i + batch_size]))
    embed_wall, embed_cpu = time.perf_counter() - started, own_cpu() - cpu
    out = {"embed_alone": embed_wall, "embed_alone_cpu": embed_cpu}
    for label, drop in (("store_hnsw", False), ("store_plain", True)):
        async with engine.begin() as conn:
            await conn.execute(text("TRUNCATE episode_embeddings"))
            if drop:
                await conn.execute(text("DROP INDEX IF EXISTS ix_episode_embeddings_hnsw_384"))
        started = time.perf_counter()
        for i in range(0, len(ids), batch_size):
            async with engine.begin() as conn:
                await store_vectors(
                    conn,
                    local.name,
                    local.dimension,
                    ids[i : i + batch_size],
                    vectors[i : i + batch_size],
                )
        out[label] = time.perf_counter() - started
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--pgvector-url", help="default: an embedded pgserver")
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=Settings().index_batch_size)
    args = parser.parse_args()
    args.data_marker = "memworker-bench-pgv-"  # bench/recall_common.py's data dir
    for label, (owner, name) in STEPS.items():
        if hasattr(owner, name):
            timed_async(owner, name, label)
    local = embedder()
    redis = Redis.from_url(args.redis_url)
    results = []
    try:
        with pgvector_server(args.pgvector_url) as server:
            for _ in range(args.rounds):
                results.append(await one_round(args, redis, server, local))
    finally:
        await redis.aclose()
    n = args.episodes
    med: Callable[[str], float] = lambda key: statistics.median(r[key] for r in results)  # noqa: E731
    labels = sorted(
        {k for r in results for k in r["steps"]}, key=lambda k: -results[0]["steps"].get(k, 0)
    )
    rows = [
        ["indexer round, end to end (wall)", f"{med('wall'):.2f} s", f"{n / med('wall'):,.0f}/s"]
    ]
    for label in labels:
        value = statistics.median(r["steps"].get(label, 0.0) for r in results)
        rows.append([label, f"{value:.2f} s", ""])
    cpu = med("cpu") + med("pg")
    cores = psutil.cpu_count() or 1
    rows += [
        ["CPU: the indexer's process", f"{med('cpu'):.2f} s", ""],
        ["CPU: Postgres", f"{med('pg'):.2f} s", ""],
        [f"… their sum over {cores} cores", f"{cpu / cores:.2f} s", f"{n * cores / cpu:,.0f}/s"],
        [
            "embedding alone, same batches (wall)",
            f"{med('embed_alone'):.2f} s",
            f"{n / med('embed_alone'):,.0f}/s",
        ],
        [
            "… its CPU",
            f"{med('embed_alone_cpu'):.2f} s",
            f"{n * cores / med('embed_alone_cpu'):,.0f}/s on {cores} cores",
        ],
        [
            "store_vectors alone, with HNSW",
            f"{med('store_hnsw'):.2f} s",
            f"{n / med('store_hnsw'):,.0f}/s",
        ],
        [
            "store_vectors alone, no index",
            f"{med('store_plain'):.2f} s",
            f"{n / med('store_plain'):,.0f}/s",
        ],
    ]
    floor = med("embed_alone") + med("store_hnsw") - med("store_plain")
    rows.append(
        ["floor: embedding alone + the HNSW inserts alone", f"{floor:.2f} s", f"{n / floor:,.0f}/s"]
    )
    print(f"{n:,} episodes a round, batches of {args.batch_size}, {args.rounds} rounds (median).")
    print()
    print(
        markdown_table(
            ["step (wall seconds per round; steps overlap)", "seconds", "rate"], rows, "lrr"
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
