"""The indexing backlog in ``memworker stats``, ``/metrics`` and the indexer's readiness
(real Redis, a PostgreSQL with pgvector)."""

from __future__ import annotations

import asyncio
import json
import time

from prometheus_client import generate_latest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.recall.test_recall_cli import memworker
from tests.recall_set import load_recall_set, remember_all
from worker.episodes.backlog import indexing_backlog, probe_indexing_backlog
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.settings import Settings


async def test_the_backlog_counts_announced_unindexed_episodes_and_readiness_follows_its_age(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    prefix = vector_settings.stream_prefix
    assert (await indexing_backlog(redis, prefix)).episodes == 0  # nothing announced yet
    episodes, _queries = load_recall_set()
    started = time.time()
    await remember_all(vector_engine, redis, prefix, "acme", episodes[:5])

    before = await indexing_backlog(redis, prefix)  # the indexer's group does not exist yet
    assert before.episodes == 5
    age = before.oldest_age_s()
    assert age is not None and 0 <= age <= time.time() - started + 1

    settings = vector_settings.model_copy(
        update={"index_max_lag_seconds": 0.5, "lag_probe_seconds": 3600.0}
    )
    indexer = Indexer(settings, redis, vector_engine, embedder)
    await indexer.ensure_groups()
    await indexer.probe_backlog_when_due()
    assert indexer.backlog is not None and indexer.backlog.episodes == 5
    metrics = generate_latest().decode()
    assert "memworker_index_backlog 5.0" in metrics
    assert "memworker_index_oldest_unindexed_seconds" in metrics
    indexer.loop._storage_checked_at = 0.0  # the loop reached its servers: only the age counts
    await asyncio.sleep(0.6)
    assert not indexer.is_ready()  # the oldest waits longer than index_max_lag_seconds

    done = memworker(vector_settings, "stats", "--json", "--rate-seconds", "0")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["indexing"]["backlog"] == 5

    assert await indexer.run_once() == 5
    await indexer.probe_backlog_when_due()  # not due yet: the last probe is kept
    assert indexer.backlog.episodes == 5
    indexer._backlog_probed = float("-inf")  # due now
    await indexer.probe_backlog_when_due()
    assert indexer.backlog == await probe_indexing_backlog(redis, prefix)
    assert indexer.backlog.episodes == 0 and indexer.backlog.oldest_age_s() is None
    assert indexer.is_ready()
    assert "memworker_index_backlog 0.0" in generate_latest().decode()
    table = memworker(vector_settings, "stats", "--rate-seconds", "0")
    assert "indexing: 0 episodes announced, not indexed yet" in table.stdout
