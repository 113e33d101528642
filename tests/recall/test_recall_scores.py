"""Recall's absolute similarity, ``min_score``, its filters, and a small project among a big one
(real Redis, a PostgreSQL with pgvector, the local embedder)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.recall_set import add_filler, load_recall_set, remember_all
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.episodes.remember import remember
from worker.episodes.store import EpisodeStore
from worker.settings import Settings

NONSENSE = "purple giraffe quantum banana xylophone"


async def indexed_recall_set(
    engine: AsyncEngine, redis: Redis, settings: Settings, embedder: LocalEmbedder, project: str
) -> dict[str, str]:
    episodes, _queries = load_recall_set()
    ids = await remember_all(engine, redis, settings.stream_prefix, project, episodes)
    await Indexer(settings, redis, engine, embedder).run_once()
    return ids


async def test_a_nonsense_querys_best_similarity_is_well_below_a_match_and_min_score_drops_it(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    await indexed_recall_set(vector_engine, redis, vector_settings, embedder, "acme")
    store = EpisodeStore(vector_engine, embedder)
    [match] = await store.recall("acme", "users cannot sign in", 1)
    [nonsense] = await store.recall("acme", NONSENSE, 1)
    assert match.episode.task_description == "Fix the login bug in the authentication service"
    assert match.similarity is not None and nonsense.similarity is not None
    assert -1.0 <= nonsense.similarity < match.similarity <= 1.0
    assert match.similarity >= 0.4
    assert nonsense.similarity <= 0.25
    assert match.similarity - nonsense.similarity >= 0.25
    # the relative scores cannot tell them apart; the similarity can
    assert abs(match.relevance - nonsense.relevance) < 0.35
    assert await store.recall("acme", NONSENSE, 5, min_score=0.35) == []
    kept = await store.recall("acme", "users cannot sign in", 10, min_score=0.35)
    assert kept and kept[0].episode.id == match.episode.id
    assert all(h.similarity is not None and h.similarity >= 0.35 for h in kept)
    row = kept[0].to_dict()
    assert row["similarity"] == round(match.similarity, 6)
    for key in ("vector_rank", "text_rank", "text_score", "relevance", "score"):
        assert key in row


async def test_text_only_hits_carry_their_similarity_and_ts_rank_and_unindexed_ones_none(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    await indexed_recall_set(vector_engine, redis, vector_settings, embedder, "acme")
    await remember(
        vector_engine,
        redis,
        vector_settings.stream_prefix,
        "acme",
        "late",
        task_description="Rotate the login signing keys of the authentication service",
    )  # announced, not indexed yet: no vector
    store = EpisodeStore(vector_engine, embedder)
    words = await store.recall("acme", "login authentication", 50, mode="text")
    assert words and all(h.text_score is not None and h.text_score > 0 for h in words)
    assert all(h.similarity is None for h in words)  # words only: the query is not embedded
    hits = await store.recall("acme", "login authentication", 50)
    late = [h for h in hits if h.episode.session_id == "remember:late"]
    assert late and late[0].similarity is None and late[0].vector_rank is None
    assert late[0].text_score is not None
    assert all(h.similarity is not None for h in hits if h is not late[0])
    assert any(h.vector_rank is None and h.similarity is not None for h in hits) or len(hits) < 50
    strict = await store.recall("acme", "login authentication", 50, min_score=-1.0)
    assert "remember:late" not in {h.episode.session_id for h in strict}  # no proven similarity
    assert strict


async def test_recall_filters_by_agent_type_outcome_user_and_time(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    ids = await indexed_recall_set(vector_engine, redis, vector_settings, embedder, "acme")
    login = ids[next(iter(ids))]
    old = datetime.now(UTC) - timedelta(days=30)
    async with vector_engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE episodes SET agent_type_id = 'coder', outcome = 'failure',"
                " user_id = 'ann', occurred_at = :old WHERE id = CAST(:id AS uuid)"
            ),
            {"old": old, "id": login},
        )
    store = EpisodeStore(vector_engine, embedder)
    query = "users cannot sign in"
    for filters in (
        {"agent_type_id": "coder"},
        {"outcome": "failure"},
        {"user_id": "ann"},
        {"until": old + timedelta(seconds=1)},
    ):
        hits = await store.recall("acme", query, 10, **filters)
        assert [str(h.episode.id) for h in hits] == [login], filters
    recent = await store.recall("acme", query, 50, since=old + timedelta(days=1))
    assert recent and login not in {str(h.episode.id) for h in recent}
    assert await store.recall("acme", query, 10, agent_type_id="nobody") == []


async def test_a_small_project_among_a_big_one_gets_all_the_results_it_asks_for(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    await indexed_recall_set(vector_engine, redis, vector_settings, embedder, "small")
    # other tenants' episodes on the same topics, around the small project's vectors
    await add_filler(vector_engine, "big", 4_000, model=embedder.name, around="small")
    async with vector_engine.begin() as conn:
        await conn.execute(text("ANALYZE episode_embeddings"))
        await conn.execute(text("ANALYZE episodes"))
    _episodes, queries = load_recall_set()
    store = EpisodeStore(vector_engine, embedder, exact_below=1_000)
    for q in queries[:8]:
        hits = await store.recall("small", q.query, 10, mode="vector")
        assert len(hits) == 10, q.query
        assert {h.episode.project_id for h in hits} == {"small"}
        similarities = [h.similarity for h in hits]
        assert similarities == sorted(similarities, reverse=True)  # type: ignore[type-var]
    # the big project itself is past exact_below: searched by the HNSW index
    big = await store.recall("big", queries[0].query, 10, mode="vector")
    assert len(big) == 10 and {h.episode.project_id for h in big} == {"big"}
