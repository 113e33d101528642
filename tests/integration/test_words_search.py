"""The words search's cap (``episodes.text_search``): above it, long queries stay answerable and
the best match still comes first."""

from __future__ import annotations

from redis.asyncio import Redis

from tests.recall_set import Unused, load_recall_set, remember_all
from worker.db.engine import create_database_engine
from worker.db.migrate import migrate_reporting
from worker.episodes.store import EpisodeStore
from worker.settings import Settings


async def test_a_capped_words_search_answers_a_pasted_log_of_hundreds_of_words(
    database_url: str, redis: Redis, settings: Settings
) -> None:
    await migrate_reporting(database_url)
    engine = create_database_engine(database_url)
    try:
        episodes, _queries = load_recall_set()
        await remember_all(engine, redis, settings.stream_prefix, "acme", episodes)
        # a scope above exact_below is capped: the three bounded reads, pairs of words included
        store = EpisodeStore(engine, Unused(), exact_below=5, text_cap=3)
        noise = " ".join(f"trace{i}frame" for i in range(600))
        for query in ("login authentication", f"login authentication {noise}"):
            hits = await store.recall("acme", query, 3, mode="text")
            assert hits, query[:40]
            best = hits[0].episode.task_description
            assert best == "Fix the login bug in the authentication service", query[:40]
    finally:
        await engine.dispose()
