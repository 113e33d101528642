"""User memory recalled by meaning: a remembered turn is embedded by the indexer, announced
``episode.recallable`` on the change feed, and then found by a query that shares no word with
it, with its cosine as ``vector_score``."""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.episodes.embedding import EmbeddingError, LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.keys import changes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Fact


async def test_a_turn_is_recallable_by_meaning_once_indexed_and_the_feed_says_so(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    vector_settings = vector_settings.model_copy(update={"remember_embedding": "indexer"})
    turns = [
        Episode(
            session_id="s1",
            user_id="ann",
            input="My dog Rex needs his vaccine shots",
            output="I will remind you to book the vet.",
        ),
        Episode(
            session_id="s1",
            user_id="ann",
            input="Plan a trip to Lisbon in May",
            output="Here is a three day itinerary.",
        ),
        Episode(
            session_id="s2",
            user_id="bob",
            input="My dog Rex needs his vaccine shots",
            output="Noted.",
        ),
    ]
    async with Memory(
        "vet", settings=vector_settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        for turn in turns:
            await memory.remember(turn)
        # by words at once, before any vector exists
        found = await memory.recall_scored("vaccine", user_id="ann", limit=1)
        [words] = found
        assert words.episode.id == turns[0].id and words.vector_score is None
        assert words.unindexed and found.unindexed == 1  # and the recall says why

        indexed = await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
        assert indexed >= 3  # the announcements, and the change feed the indexer reads too

        entries: Any = await redis.xrange(
            changes_stream(vector_settings.stream_prefix, "vet", vector_settings.shards)
        )
        events = [orjson.loads(fields[b"data"]) for _id, fields in entries]
        recallable = [e for e in events if e["type"] == "episode.recallable"]
        assert {e["episode_id"] for e in recallable} == {t.id for t in turns}
        assert {e["user_id"] for e in recallable} == {"ann", "bob"}

        matches = await memory.recall_scored("puppy immunisation appointment", user_id="ann")
        assert matches[0].episode.id == turns[0].id
        assert matches[0].vector_score is not None and 0.3 < matches[0].vector_score <= 1.0
        assert matches[0].bm25_score is None  # no word in common: found by meaning alone
        assert all(m.episode.user_id == "ann" for m in matches)


async def test_facts_are_recalled_by_meaning_once_the_indexer_embeds_them(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    async with Memory("kb", settings=vector_settings, engine=vector_engine, redis=redis) as memory:
        food = await memory.facts.append(
            Fact(user_id="ann", subject="ann", predicate="likes", object="spicy Thai curry")
        )
        await memory.facts.append(
            Fact(user_id="ann", subject="ann", predicate="owns", object="a red bicycle")
        )
        await memory.facts.append(
            Fact(user_id="bob", subject="bob", predicate="likes", object="spicy Thai curry")
        )
        query = "what meal does she enjoy eating"
        assert await memory.recall_facts(query, user_id="ann") == []  # no word in common yet

        await Indexer(vector_settings, redis, vector_engine, embedder).run_once()  # the feed

        [best, *_rest] = await memory.recall_facts(query, user_id="ann")
        assert best.id == food
        assert all(f.user_id == "ann" for f in await memory.recall_facts(query, user_id="ann"))
        # words still find a fact at once, before the indexer sees it
        late = await memory.facts.append(
            Fact(user_id="ann", subject="ann", predicate="speaks", object="Portuguese")
        )
        assert late in [f.id for f in await memory.recall_facts("Portuguese", user_id="ann")]


class DownEmbedder:
    """The local model's name and dimension, and an embedding server that does not answer."""

    name = LocalEmbedder.name
    dimension = LocalEmbedder.dimension

    async def embed(self, texts: Any) -> list[list[float]]:
        raise EmbeddingError("the embedding server did not answer")


async def test_a_recall_whose_query_cannot_be_embedded_finds_by_words_and_says_so(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    turns = [
        Episode(
            session_id="s1", user_id="ann", input="My dog Rex needs his vaccine shots", output=""
        ),
        Episode(session_id="s1", user_id="ann", input="Plan a trip to Lisbon in May", output=""),
    ]
    async with Memory(
        "vet", settings=vector_settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        for turn in turns:
            await memory.remember(turn)  # embedded as it is remembered
        assert (await memory.recall_scored("vaccine for my dog", user_id="ann"))[0].vector_score
    async with Memory(
        "vet", settings=vector_settings, embedder=DownEmbedder(), engine=vector_engine, redis=redis
    ) as memory:
        found = await memory.recall_scored("vaccine for my dog", user_id="ann")
        assert [m.episode.id for m in found][:1] == [turns[0].id]  # by its words
        assert all(m.vector_score is None and m.unindexed for m in found)
        assert found.unindexed == len(found)  # not searched by meaning: said, not silent
