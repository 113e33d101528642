"""The OpenAI-compatible HTTP embedder against a real server (infinity serving the same
all-MiniLM-L6-v2 weights), and the indexer's outage behaviour when that server is down."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.embedding_server import embedding_server
from tests.recall_set import load_recall_set, remember_all
from worker.consumers.loop import StorageUnavailableError
from worker.episodes.embedding import (
    EmbeddingError,
    LocalEmbedder,
    OpenAIEmbedder,
)
from worker.episodes.indexer import INDEXER_GROUP, Indexer, indexer_dlq
from worker.episodes.store import EpisodeStore
from worker.keys import episodes_stream
from worker.settings import LOCAL_EMBEDDING_DIMENSION, LOCAL_EMBEDDING_MODEL, Settings


@pytest.fixture(scope="session")
def embeddings_url() -> Iterator[str]:
    with embedding_server() as url:
        yield url


def http_embedder(url: str) -> OpenAIEmbedder:
    return OpenAIEmbedder(url, LOCAL_EMBEDDING_MODEL, LOCAL_EMBEDDING_DIMENSION)


async def test_the_http_embedder_returns_the_same_vectors_as_the_local_model(
    embeddings_url: str, embedder: LocalEmbedder
) -> None:
    remote = http_embedder(embeddings_url)
    try:
        texts = ["Fix the login bug in the authentication service", "users cannot sign in"]
        got = await remote.embed(texts)
    finally:
        await remote.aclose()
    local = await embedder.embed(texts)
    assert [len(v) for v in got] == [384, 384]
    for g, mine in zip(got, local, strict=True):
        assert math.isclose(sum(x * x for x in g), 1.0, rel_tol=1e-6)
        assert sum(a * b for a, b in zip(g, mine, strict=True)) > 0.99


async def test_with_its_embedding_server_down_the_indexer_holds_then_indexes_when_it_is_back(
    embeddings_url: str,
    vector_engine: AsyncEngine,
    redis: Redis,
    vector_settings: Settings,
) -> None:
    episodes, _queries = load_recall_set()
    await remember_all(vector_engine, redis, vector_settings.stream_prefix, "acme", episodes[:4])
    down = http_embedder("http://127.0.0.1:9/v1")  # nothing listens on the discard port
    indexer = Indexer(vector_settings, redis, vector_engine, down, consumer="c1")
    with pytest.raises(StorageUnavailableError, match="embedder cannot be used"):
        await indexer.run_once()
    stream = episodes_stream(vector_settings.stream_prefix)
    assert (await redis.xpending(stream, INDEXER_GROUP))["pending"] == 4
    assert await redis.xlen(indexer_dlq(vector_settings.stream_prefix)) == 0
    await down.aclose()
    up = http_embedder(embeddings_url)
    try:
        again = Indexer(vector_settings, redis, vector_engine, up, consumer="c1")
        assert await again.run_once() == 4
        hits = await EpisodeStore(vector_engine, up).recall("acme", "users cannot sign in", 1)
    finally:
        await up.aclose()
    assert hits[0].episode.task_description == "Fix the login bug in the authentication service"
    assert (await redis.xpending(stream, INDEXER_GROUP))["pending"] == 0


async def test_an_unreachable_embedding_server_is_one_clear_error() -> None:
    down = http_embedder("http://127.0.0.1:9/v1")
    try:
        with pytest.raises(
            EmbeddingError, match=r"http://127.0.0.1:9/v1/embeddings did not answer"
        ):
            await down.embed(["anything"])
    finally:
        await down.aclose()
