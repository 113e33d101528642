"""Recall by meaning against real Redis and a real PostgreSQL with pgvector."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
from datetime import datetime
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.results_factory import publish, terminated
from tests.recall_set import LabeledEpisode, load_recall_set, remember_all
from worker.consolidation.consolidator import Consolidator
from worker.consumers.loop import StreamEntry
from worker.db.vectors import drop_other_models, store_vectors
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import INDEXER_GROUP, Indexer
from worker.episodes.remember import remember
from worker.episodes.store import EpisodeStore, RecallMode
from worker.episodes.vectorising import reindex
from worker.keys import changes_stream, episodes_stream
from worker.settings import Settings


async def vector_rows(engine: AsyncEngine) -> list[tuple[str, str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT episode_id::text, model, embedded_at::text FROM episode_embeddings"
                " ORDER BY episode_id"
            )
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def test_episodes_are_recalled_by_meaning_when_the_query_shares_no_word_with_them(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    episodes, queries = load_recall_set()
    ids = await remember_all(vector_engine, redis, vector_settings.stream_prefix, "acme", episodes)
    indexer = Indexer(vector_settings, redis, vector_engine, embedder)
    assert await indexer.run_once() == len(episodes)
    store = EpisodeStore(vector_engine, embedder)

    async def hits_at_3(mode: RecallMode) -> int:
        found = 0
        for q in queries:
            top = await store.recall("acme", q.query, 3, mode=mode)
            found += ids[q.expect] in [str(h.episode.id) for h in top]
        return found

    text_only, hybrid = await hits_at_3("text"), await hits_at_3("hybrid")
    assert hybrid >= 0.75 * len(queries)
    assert hybrid > text_only
    [best] = await store.recall("acme", "users cannot sign in", 1)
    assert best.episode.task_description == "Fix the login bug in the authentication service"


async def test_recall_never_returns_another_projects_identical_episodes(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    episodes, _queries = load_recall_set()
    mine = await remember_all(
        vector_engine, redis, vector_settings.stream_prefix, "mine", episodes[:10]
    )
    theirs = await remember_all(
        vector_engine, redis, vector_settings.stream_prefix, "theirs", episodes
    )
    await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
    store = EpisodeStore(vector_engine, embedder)
    modes: tuple[RecallMode, ...] = ("hybrid", "vector", "text")
    for mode in modes:
        hits = await store.recall("mine", "users cannot sign in login", 50, mode=mode)
        assert hits, mode
        assert {str(h.episode.id) for h in hits} <= set(mine.values()), mode
        assert all(h.episode.project_id == "mine" for h in hits)
    assert not set(mine.values()) & set(theirs.values())
    assert await store.recall("nobody", "users cannot sign in", 10) == []


async def test_redelivery_and_replay_leave_exactly_one_unchanged_vector_per_episode(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    episodes, _queries = load_recall_set()
    await remember_all(vector_engine, redis, vector_settings.stream_prefix, "acme", episodes[:8])
    stream = episodes_stream(vector_settings.stream_prefix)
    first = Indexer(vector_settings, redis, vector_engine, embedder, consumer="one")
    assert await first.run_once() == 8
    before = await vector_rows(vector_engine)
    # replay: every announcement read again by the group, and announced a second time
    await redis.xgroup_setid(stream, INDEXER_GROUP, "0")
    entries: Any = await redis.xrange(stream)
    for _id, fields in entries:
        await redis.xadd(stream, fields)
    again = Indexer(vector_settings, redis, vector_engine, embedder, consumer="two")
    assert await again.run_once() == 16
    assert await vector_rows(vector_engine) == before
    assert len(before) == 8
    pending = await redis.xpending(stream, INDEXER_GROUP)
    assert pending["pending"] == 0


async def test_an_indexer_killed_mid_stream_loses_no_vector_and_duplicates_none(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    episodes, _queries = load_recall_set()
    batch = [
        LabeledEpisode(f"{e.key}-{n}", f"{e.task} (case {n})", e.lessons)
        for n in range(5)
        for e in episodes
    ]
    ids = await remember_all(vector_engine, redis, vector_settings.stream_prefix, "acme", batch)
    env = dict(
        os.environ,
        REDIS_URL=vector_settings.redis_url,
        DATABASE_URL=vector_settings.database_url,
        MEMWORKER_STREAM_PREFIX=vector_settings.stream_prefix,
        MEMWORKER_INDEX_BATCH_SIZE="16",
        MEMWORKER_LOG_LEVEL="WARNING",
    )
    process = subprocess.Popen([sys.executable, "-m", "worker.cli", "index"], env=env)
    try:
        while len(await vector_rows(vector_engine)) < 16:  # it has stored some batches
            assert process.poll() is None, "the indexer exited"
            await asyncio.sleep(0.2)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    stored = len(await vector_rows(vector_engine))
    assert stored < len(batch), "the indexer finished before it was killed"
    successor = Indexer(
        vector_settings, redis, vector_engine, embedder, consumer="successor", reclaim_idle_ms=1
    )
    await successor.run_once()
    rows = await vector_rows(vector_engine)
    assert sorted(r[0] for r in rows) == sorted(ids.values())
    stream = episodes_stream(vector_settings.stream_prefix)
    assert (await redis.xpending(stream, INDEXER_GROUP))["pending"] == 0


async def test_overlapping_batches_index_each_episode_once_and_a_dropped_one_embeds_nothing(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    """Batches of 4: each batch's embedding starts when it is read, while the one before it is
    written; every episode gets one vector and one ``episode.recallable``. A batch read ahead
    and then dropped (the loop does so when the batch before it failed) has its embedding
    cancelled before it stored anything; its entries are indexed when read again."""
    episodes, _queries = load_recall_set()
    prefix = vector_settings.stream_prefix
    await remember_all(vector_engine, redis, prefix, "acme", episodes[:7])
    await remember_all(vector_engine, redis, prefix, "globex", episodes[7:12])
    settings = vector_settings.model_copy(update={"index_batch_size": 4})
    indexer = Indexer(settings, redis, vector_engine, embedder)
    assert await indexer.run_once() == 12
    assert len(await vector_rows(vector_engine)) == 12
    recallable: list[str] = []
    for project in ("acme", "globex"):
        entries: Any = await redis.xrange(changes_stream(prefix, project, settings.shards))
        events = [orjson.loads(fields[b"data"]) for _id, fields in entries]
        recallable += [
            e["episode_id"]
            for e in events
            if e["type"] == "episode.recallable" and e["project_id"] == project
        ]
    assert len(recallable) == len(set(recallable)) == 12

    await remember_all(vector_engine, redis, prefix, "acme", episodes[12:16])
    stream = episodes_stream(prefix)
    last: Any = await redis.xrange(stream)
    read = [StreamEntry(stream, i.decode(), {"data": f[b"data"]}) for i, f in last[-4:]]
    batch = await indexer.prepare(read)
    embedding = batch.embedding
    assert embedding is not None
    del batch  # dropped unfinished
    gc.collect()
    await asyncio.gather(embedding, return_exceptions=True)
    assert embedding.cancelled()
    assert len(await vector_rows(vector_engine)) == 12
    assert await indexer.run_once() == 4
    assert len(await vector_rows(vector_engine)) == 16


async def test_remembering_twice_with_one_id_stores_and_announces_one_episode(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings
) -> None:
    args = (vector_engine, redis, vector_settings.stream_prefix, "acme", "note-1")
    first = await remember(*args, task_description="Deploy on Fridays only with a rollback plan")
    second = await remember(*args, task_description="Deploy on Fridays only with a rollback plan")
    assert first.episode_id == second.episode_id
    assert (first.announced, second.announced) == (True, False)
    assert await redis.xlen(episodes_stream(vector_settings.stream_prefix)) == 1
    store = EpisodeStore(vector_engine)
    [episode] = await store.list_episodes("acme")
    assert episode.session_id == "remember:note-1"


async def test_a_consolidated_episode_is_indexed_and_recalled_by_meaning(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    result = terminated(
        "acme",
        "s1",
        task_description="Fix the login bug in the authentication service",
        lessons=["check token expiry before retrying"],
    )
    await publish(redis, vector_settings, [result])
    consolidator = Consolidator(vector_settings, redis, vector_engine)
    assert await consolidator.run_once() == 1
    assert await Indexer(vector_settings, redis, vector_engine, embedder).run_once() == 1
    hits = await EpisodeStore(vector_engine, embedder).recall("acme", "users cannot sign in", 5)
    assert [h.episode.session_id for h in hits] == ["s1"]
    assert hits[0].vector_rank == 1


async def test_forget_removes_vectors_and_export_carries_them(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    episodes, _queries = load_recall_set()
    await remember_all(vector_engine, redis, vector_settings.stream_prefix, "acme", episodes[:3])
    await remember_all(vector_engine, redis, vector_settings.stream_prefix, "other", episodes[:3])
    await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
    store = EpisodeStore(vector_engine, embedder)
    export = await store.export("acme")
    assert [e["embedding"]["model"] for e in export.episodes] == ["all-MiniLM-L6-v2"] * 3
    assert all(len(e["embedding"]["vector"]) == 384 for e in export.episodes)
    removed = await store.forget("acme")
    assert removed.episodes == 3
    assert len(await vector_rows(vector_engine)) == 3  # the other project's are kept
    assert await store.recall("acme", "users cannot sign in", 10) == []


async def test_reindex_fills_missing_vectors_beside_another_model_s_until_those_are_dropped(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    episodes, _queries = load_recall_set()
    ids = await remember_all(
        vector_engine, redis, vector_settings.stream_prefix, "acme", episodes[:6]
    )
    old = [ids[e.key] for e in episodes[:3]]
    async with vector_engine.begin() as conn:
        await store_vectors(conn, "old-model", 3, old, [[1.0, 0.0, 0.0]] * 3)
    assert await reindex(vector_engine, embedder) == 6
    rows = await vector_rows(vector_engine)
    assert sorted(r[1] for r in rows) == ["all-MiniLM-L6-v2"] * 6 + ["old-model"] * 3
    assert await reindex(vector_engine, embedder) == 0
    async with vector_engine.begin() as conn:
        assert await drop_other_models(conn, embedder.name, "other-project") == 0
        assert await drop_other_models(conn, embedder.name, "acme") == 3
    rows = await vector_rows(vector_engine)
    assert {r[1] for r in rows} == {"all-MiniLM-L6-v2"}
    assert len(rows) == 6


async def test_before_the_indexer_ran_recall_uses_words_and_says_so_once(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    episodes, _queries = load_recall_set()
    await remember_all(vector_engine, redis, vector_settings.stream_prefix, "acme", episodes)
    store = EpisodeStore(vector_engine, embedder)
    with structlog.testing.capture_logs() as logs:
        first = await store.recall("acme", "login authentication", 3)
        await store.recall("acme", "spanish emails", 3)
    assert first[0].episode.task_description == "Fix the login bug in the authentication service"
    assert first[0].vector_rank is None
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0].startswith("project acme has no all-MiniLM-L6-v2 vectors yet")


async def test_forget_counts_the_vectors_and_no_replayed_announcement_embeds_them_again(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    from sqlalchemy import insert

    from worker.db.models import Episode

    episodes, _queries = load_recall_set()
    prefix = vector_settings.stream_prefix
    await remember_all(vector_engine, redis, prefix, "acme", episodes[:3])
    await remember_all(vector_engine, redis, prefix, "other", episodes[:3])
    await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
    stream = episodes_stream(prefix)
    announced: Any = await redis.xrange(stream)  # what a restored Redis would hold again
    store = EpisodeStore(vector_engine, embedder)
    rows = (await store.export("acme")).episodes

    removed = await store.forget("acme", redis=redis, prefix=prefix)

    assert removed.receipt is not None
    assert removed.receipt.postgres["episode_embeddings"] == 3
    feed = changes_stream(prefix, "acme", vector_settings.shards)
    # the project's episode.recorded, and its episode.recallable on the change feed
    assert removed.receipt.streams == {stream: 3, feed: 3}
    assert len(await vector_rows(vector_engine)) == 3  # the other project's are kept
    # A partial restore brings an episode row and every announcement back: nothing is embedded.
    kept = {c.name for c in Episode.__table__.columns if c.name != "search_vector"}
    restored = {k: v for k, v in rows[0].items() if k in kept and not k.endswith("_at")}
    restored["occurred_at"] = datetime.fromisoformat(rows[0]["occurred_at"])
    # a restore keeps the row's write time (a forget covers what was written before it)
    restored["recorded_at"] = datetime.fromisoformat(rows[0]["recorded_at"])
    async with vector_engine.begin() as conn:
        await conn.execute(insert(Episode).values(**restored))
    for _id, fields in announced:
        await redis.xadd(stream, fields)
    await Indexer(vector_settings, redis, vector_engine, embedder, consumer="later").run_once()
    assert len(await vector_rows(vector_engine)) == 3
    assert await store.recall("acme", "users cannot sign in", 10, mode="vector") == []
