"""Recall by meaning with the library alone: with no indexer running, ``Memory.remember``
embeds the turn itself, so it is recallable by meaning when ``remember`` returns; with an
indexer running, ``remember`` leaves the turn to it and ``wait_recallable`` waits for its
vector; a recall that ran without some vectors says so; ``memworker reindex`` to a new model
keeps the old vectors until the new ones are in."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
import structlog
from prometheus_client import REGISTRY
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.migrate import migrate_reporting
from worker.db.vectors import drop_other_models
from worker.episodes.embedding import LocalEmbedder, OpenAIEmbedder
from worker.episodes.indexer import INDEXER_GROUP, Indexer
from worker.episodes.vectorising import reindex
from worker.keys import changes_stream, episodes_stream
from worker.settings import Settings
from worker.user_memory.indexing import (
    NotRecallableError,
    UnknownEpisodeError,
    indexer_running,
)
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

VET = "My dog Rex needs his vaccine shots"
TRIP = "Plan a trip to Lisbon in May"
CAKE = "Bake a chocolate birthday cake for Sunday"


def turn(text_: str, user: str = "ann") -> Episode:
    """A turn in a session of its own: what these tests check is who embeds it and when, not
    how a session's neighbouring turns lend each other context (``turn_ranking``)."""
    session = "s-" + "".join(c for c in text_.lower() if c.isalnum())[:24]
    return Episode(session_id=session, user_id=user, input=text_, output="Noted.")


async def vectors(engine: AsyncEngine, model: str | None = None) -> list[tuple[str, str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT episode_id::text, model, embedded_at::text FROM episode_embeddings"
                " WHERE CAST(:m AS text) IS NULL OR model = :m ORDER BY 1, 2"
            ),
            {"m": model},
        )
        return [(r[0], r[1], r[2]) for r in rows]


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_with_no_indexer_a_remembered_turn_is_recallable_by_meaning_at_once(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    embedded_before = sample("memworker_embedded_at_remember_total", {"outcome": "done"})
    async with Memory(
        "vet", settings=vector_settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        vet, trip = turn(VET), turn(TRIP)
        await asyncio.gather(memory.remember(vet), memory.remember(trip))  # one batch

        found = await memory.recall_scored("puppy immunisation appointment", user_id="ann")
        assert found[0].episode.id == vet.id
        assert found[0].vector_score is not None and found[0].vector_score > 0.3
        assert found[0].bm25_score is None  # no word in common: by meaning alone
        assert found.unindexed == 0 and not any(m.unindexed for m in found)
        await memory.wait_recallable([vet.id, trip.id], timeout=0)  # already: returns

    assert sample("memworker_embedded_at_remember_total", {"outcome": "done"}) == (
        embedded_before + 2
    )
    stored = await vectors(vector_engine)
    assert len(stored) == 2
    entries: Any = await redis.xrange(
        changes_stream(vector_settings.stream_prefix, "vet", vector_settings.shards)
    )
    events = [orjson.loads(fields[b"data"]) for _id, fields in entries]
    recallable = {e["episode_id"] for e in events if e["type"] == "episode.recallable"}
    assert recallable == {vet.id, trip.id}

    # an indexer started later reads the announcements and writes nothing again
    await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
    assert await vectors(vector_engine) == stored
    # and forget takes the vectors remember wrote
    async with Memory("vet", settings=vector_settings, engine=vector_engine, redis=redis) as m:
        assert await m.forget(user_id="ann") == 2
    assert await vectors(vector_engine) == []


async def test_with_an_indexer_running_remember_leaves_the_turn_to_it_and_wait_recallable_waits(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    indexer = Indexer(vector_settings, redis, vector_engine, embedder)
    await indexer.run_once()  # its consumer is now seen in group indexer on P:episodes
    async with Memory(
        "vet", settings=vector_settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        vet, trip = turn(VET), turn(TRIP)
        await memory.remember(vet)
        await memory.remember(trip)
        assert await vectors(vector_engine) == []  # not embedded inline

        with pytest.raises(NotRecallableError) as timed_out:
            await memory.wait_recallable([vet.id, trip.id], timeout=0.2)
        assert isinstance(timed_out.value, TimeoutError)
        assert set(timed_out.value.missing) == {vet.id, trip.id}
        assert vet.id in str(timed_out.value) and trip.id in str(timed_out.value)
        with pytest.raises(UnknownEpisodeError, match="never-remembered"):
            await memory.wait_recallable([vet.id, "never-remembered"], timeout=1)

        async def index_soon() -> None:
            await asyncio.sleep(0.3)
            await indexer.run_once()

        indexing = asyncio.create_task(index_soon())
        await memory.wait_recallable([vet.id, trip.id], timeout=30)
        await indexing
        found = await memory.recall_scored("puppy immunisation appointment", user_id="ann")
        assert found[0].episode.id == vet.id and found[0].vector_score is not None
    await indexer.close()


async def test_a_recall_that_runs_without_some_vectors_says_so(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    """One turn embedded, one left to an indexer that has not run: the recall flags the second
    (match and result), warns and counts it."""
    inline = vector_settings.model_copy(update={"remember_embedding": "inline"})
    later = vector_settings.model_copy(update={"remember_embedding": "indexer"})
    async with (
        Memory("m", settings=inline, embedder=embedder, engine=vector_engine, redis=redis) as a,
        Memory("m", settings=later, embedder=embedder, engine=vector_engine, redis=redis) as b,
    ):
        embedded, waiting = turn("My dog Rex loves the vet"), turn("My dog Rex hates baths")
        await b.remember(waiting)
        # no vector at all yet: a query whose words match nothing falls back to the newest
        # turns (score 0), and says they had none
        fallback = await b.recall_scored("zzzqqq", user_id="ann")
        assert [m.episode.id for m in fallback] == [waiting.id] and fallback[0].score == 0.0
        assert fallback[0].unindexed and fallback.unindexed == 1

        await a.remember(embedded)
        counted = sample("memworker_recall_unindexed_total")
        with structlog.testing.capture_logs() as logs:
            found = await a.recall_scored("dog Rex", user_id="ann")
        by_id = {m.episode.id: m for m in found}
        assert by_id[waiting.id].unindexed and by_id[waiting.id].vector_score is None
        assert not by_id[embedded.id].unindexed and by_id[embedded.id].vector_score is not None
        assert found.unindexed == 1
        assert sample("memworker_recall_unindexed_total") == counted + 1
        assert any("without vectors" in line["event"] for line in logs)
        # words only (alpha 0) wants no vectors: nothing to flag
        assert (await a.recall_scored("dog Rex", user_id="ann", alpha=0.0)).unindexed == 0

        # no indexer runs: waiting for it embeds it here
        await a.wait_recallable([waiting.id], timeout=5)
        found = await a.recall_scored("dog Rex", user_id="ann")
        assert found.unindexed == 0 and all(m.vector_score is not None for m in found)


async def test_an_indexer_counts_as_running_while_its_consumer_is_seen(
    redis: Redis, vector_settings: Settings
) -> None:
    prefix = vector_settings.stream_prefix
    stream = episodes_stream(prefix)
    assert not await indexer_running(redis, prefix)  # no stream, no group
    await redis.xgroup_create(stream, INDEXER_GROUP, id="0", mkstream=True)
    assert not await indexer_running(redis, prefix)  # a group, no consumer
    await redis.xgroup_createconsumer(stream, INDEXER_GROUP, "indexer-1")
    assert await indexer_running(redis, prefix)
    await asyncio.sleep(0.3)
    assert not await indexer_running(redis, prefix, seen_ms=200)  # not seen since: gone


class Renamed:
    """The local model's vectors under another model's name, embedding one batch then waiting
    for ``go``: a model change, paused half way."""

    def __init__(self, local: LocalEmbedder, name: str) -> None:
        self.local = local
        self.name = name
        self.dimension = local.dimension
        self.batches = 0
        self.paused = asyncio.Event()
        self.go = asyncio.Event()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.batches == 1:
            self.paused.set()
            await self.go.wait()
        self.batches += 1
        return await self.local.embed(texts)


async def test_reindex_to_a_new_model_keeps_the_old_vectors_until_the_new_ones_are_in(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    texts = [VET, TRIP, CAKE]
    queries = ["puppy immunisation appointment", "holiday in Portugal", "dessert for a party"]
    async with Memory(
        "re", settings=vector_settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        turns = [turn(t) for t in texts]
        for t in turns:
            await memory.remember(t)
        assert len(await vectors(vector_engine, embedder.name)) == 3

        new = Renamed(embedder, "all-MiniLM-L6-v2-next")
        running = asyncio.create_task(reindex(vector_engine, new, project_id="re", batch_size=1))
        await asyncio.wait_for(new.paused.wait(), 30)
        # one episode has its new vector, two do not yet: recall by the old model finds all
        assert len(await vectors(vector_engine, new.name)) == 1
        assert len(await vectors(vector_engine, embedder.name)) == 3
        for t, query in zip(turns, queries, strict=True):
            [best] = await memory.recall_scored(query, user_id="ann", limit=1)
            assert best.episode.id == t.id and best.vector_score is not None
        new.go.set()
        assert await running == 3
        async with vector_engine.begin() as conn:
            assert await drop_other_models(conn, new.name, "re") == 3
        assert {m for _e, m, _at in await vectors(vector_engine)} == {new.name}

    async with Memory(
        "re", settings=vector_settings, embedder=new, engine=vector_engine, redis=redis
    ) as renamed:
        [best] = await renamed.recall_scored(queries[2], user_id="ann", limit=1)
        assert best.episode.id == turns[2].id and best.vector_score is not None


async def test_migrate_keys_an_older_vector_table_by_episode_and_model(
    vector_database_url: str, vector_engine: AsyncEngine
) -> None:
    """A table made when one vector per episode was the key gets ``(episode_id, model)``."""
    key = text(
        "SELECT array_length(conkey, 1) FROM pg_constraint"
        " WHERE conrelid = 'episode_embeddings'::regclass AND contype = 'p'"
    )
    async with vector_engine.begin() as conn:
        await conn.execute(
            text(
                "ALTER TABLE episode_embeddings DROP CONSTRAINT episode_embeddings_pkey,"
                " ADD CONSTRAINT episode_embeddings_pkey PRIMARY KEY (episode_id)"
            )
        )
        assert (await conn.execute(key)).scalar_one() == 1
    _revision, missing = await migrate_reporting(vector_database_url)
    assert missing is None
    async with vector_engine.connect() as conn:
        assert (await conn.execute(key)).scalar_one() == 2


async def test_an_embedder_that_does_not_answer_never_fails_remember(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings
) -> None:
    """The turn is stored and announced for an indexer; the failure is logged and counted."""
    down = OpenAIEmbedder("http://127.0.0.1:9/v1", "remote-model", 384, timeout_s=2)
    failed = sample("memworker_embedded_at_remember_total", {"outcome": "failed"})
    async with Memory(
        "down", settings=vector_settings, embedder=down, engine=vector_engine, redis=redis
    ) as memory:
        vet = turn(VET)
        with structlog.testing.capture_logs() as logs:
            assert await memory.remember(vet) == vet.id
        assert any("not embedded at remember" in line["event"] for line in logs)
        assert sample("memworker_embedded_at_remember_total", {"outcome": "failed"}) == failed + 1
        assert await vectors(vector_engine) == []
        [words] = await memory.recall_scored("vaccine", user_id="ann")
        assert words.episode.id == vet.id and words.unindexed
        await memory.flush_changes()  # remember returns before its announcement goes
        stream: Any = await redis.xrange(episodes_stream(vector_settings.stream_prefix))
        assert len(stream) == 1  # announced: an indexer embeds it once it can
    await down.aclose()
