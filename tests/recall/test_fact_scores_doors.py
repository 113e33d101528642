"""A fact's scores at every door, and where its cosine is taken.

``recall_facts_scored`` over HTTP (``POST /v1/recall_facts_scored``) and MCP answers what
``Memory.recall_facts_scored`` returns (the same facts, order and scores), refusing bad
arguments with a 4xx naming the field; on a server with pgvector the facts' cosines are taken
in Postgres, and the facts, their order and scores are those of the cosines taken in Python
(every vector read), also for a fact found by its words past the nearest by meaning."""

from __future__ import annotations

import json
import sys
from itertools import pairwise
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.inspector_server import PROJECT, TOKEN, env_for, serving
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.settings import Settings
from worker.user_memory import facts as facts_module
from worker.user_memory.fact_ranking import FUSED_CANDIDATES, cosines
from worker.user_memory.memory import Memory
from worker.user_memory.models import Fact, FactMatch

CLAIMS = [
    ("likes", "spicy Thai curry"),
    ("owns", "a red bicycle"),
    ("commutes_by", "the Cacilhas ferry"),
    ("likes", "green tea in the morning"),
    ("cooks", "spicy bacalhau on Sundays"),
]
QUERY = "what spicy food does she enjoy"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def as_json(found: list[FactMatch]) -> list[Any]:
    return [m.model_dump(mode="json") for m in found]


async def test_http_and_mcp_answer_the_fact_scores_memory_returns(
    vector_engine: AsyncEngine,
    redis: Redis,
    vector_settings: Settings,
    vector_database_url: str,
    embedder: LocalEmbedder,
) -> None:
    async with Memory(PROJECT, settings=vector_settings, engine=vector_engine, redis=redis) as mem:
        for predicate, obj in CLAIMS:
            await mem.facts.append(
                Fact(user_id="ann", subject="ann", predicate=predicate, object=obj)
            )
        await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
        await mem.facts.append(  # not embedded yet: found by its words alone
            Fact(user_id="ann", subject="ann", predicate="orders", object="spicy noodles")
        )
        expected = as_json(await mem.recall_facts_scored(QUERY, limit=10, user_id="ann"))
    assert any(m["vector_score"] is not None and m["word_score"] is not None for m in expected)
    assert any(m["vector_score"] is None for m in expected)
    asked: dict[str, Any] = {"user_id": "ann", "query": QUERY, "limit": 10}

    env = env_for(vector_settings, vector_database_url)
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=120, headers=AUTH) as http:
            got = await http.post("/v1/recall_facts_scored", json=asked)
            assert got.status_code == 200, got.text
            assert got.json() == expected
            cases: list[tuple[dict[str, Any], str]] = [
                ({"limit": 0}, "limit"),
                ({"limit": "3"}, "limit"),
                ({"query": 5}, "query"),
                ({"query": " "}, "query"),
                ({"valid_at": "yesterday"}, "valid_at"),
                ({"user_id": "a b"}, "user_id"),
                ({"colour": 1}, "colour"),
            ]
            for body, field in cases:
                refused = await http.post("/v1/recall_facts_scored", json={**asked, **body})
                assert 400 <= refused.status_code < 500, (body, refused.text)
                assert field in refused.json()["error"], (body, refused.text)
            document = (await http.get("/openapi.json")).json()
            assert "/v1/recall_facts_scored" in document["paths"]

    server = StdioServerParameters(
        command=sys.executable, args=["-m", "worker.cli", "mcp", "--project", PROJECT], env=env
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        done = await session.call_tool("recall_facts_scored", asked)
        assert not done.is_error, done
        [content] = done.content
        assert json.loads(content.text) == expected  # type: ignore[union-attr]
        bad = await session.call_tool("recall_facts_scored", {**asked, "limit": 0})
        assert bad.is_error
        [said] = bad.content
        assert "limit" in json.loads(said.text)["error"]  # type: ignore[union-attr]


async def test_the_cosines_taken_in_postgres_rank_and_score_as_those_taken_in_python(
    vector_engine: AsyncEngine,
    redis: Redis,
    vector_settings: Settings,
    embedder: LocalEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    foods = ["curry", "noodles", "tea", "bacalhau", "soup", "bread", "rice", "salad"]
    things = ["bicycle", "ferry", "piano", "garden", "laptop", "boat", "camera", "guitar"]
    claims = [
        (f"likes_{i}", f"{foods[i % 8]} and a {things[i // 8 % 8]} no {i}") for i in range(90)
    ]
    claims += [(f"renews_{i}", f"the Dinner Street parking permit form {i}") for i in range(30)]
    async with Memory("kb", settings=vector_settings, engine=vector_engine, redis=redis) as mem:
        await mem.facts.append_many(
            Fact(user_id="ann", subject="ann", predicate=p, object=o) for p, o in claims
        )
        await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
        async with vector_engine.connect() as conn:
            embedded = await conn.scalar(
                text("SELECT count(*) FROM facts WHERE embedding_model IS NOT NULL")
            )
        assert embedded == len(claims)
        async with vector_engine.begin() as conn:  # a zero vector's cosine is 0.0
            await conn.execute(
                text(
                    "UPDATE facts SET embedding = array_fill(0.0::float8, ARRAY[384])"
                    " WHERE predicate = 'likes_0'"
                )
            )
        query = "spicy curry for dinner"
        in_postgres = await mem.recall_facts_scored(query, limit=100, user_id="ann")

        async def no_vector_type(conn: Any) -> bool:
            return False

        monkeypatch.setattr(facts_module, "_has_vector_type", no_vector_type)
        in_python = await mem.recall_facts_scored(query, limit=100, user_id="ann")

    assert [m.fact.id for m in in_postgres] == [m.fact.id for m in in_python]
    for sql, py in zip(in_postgres, in_python, strict=True):
        assert sql.score == py.score and sql.word_score == py.word_score, (sql, py)
        assert (sql.vector_score is None) is (py.vector_score is None)
        if py.vector_score is not None:
            assert sql.vector_score == pytest.approx(py.vector_score, abs=1e-6)
    [zero] = [m for m in in_postgres if m.fact.predicate == "likes_0"]
    assert zero.vector_score == 0.0
    # the words' candidates past the nearest by meaning still show their cosine
    by_meaning = sorted(
        (m for m in in_python if m.vector_score is not None), key=lambda m: -(m.vector_score or 0)
    )
    assert len(in_python) > FUSED_CANDIDATES
    far = [m for m in in_postgres if m.word_score is not None and m.vector_score is not None]
    assert any(m.vector_score < by_meaning[FUSED_CANDIDATES - 1].vector_score for m in far)  # type: ignore[operator]


async def test_a_store_embedding_its_own_facts_ranks_by_cosines_taken_in_postgres(
    vector_engine: AsyncEngine, embedder: LocalEmbedder
) -> None:
    """``FactStore(embedder=...)`` (LoomFlow's way: meaning alone), past ``FUSED_CANDIDATES``:
    the best ``limit`` by cosine, each the cosine of its stored vector."""
    store = facts_module.FactStore(vector_engine, "own", embedder=embedder)
    objects = [f"a {w} number {i}" for i, w in enumerate(["cat", "kettle", "poem", "train"] * 20)]
    await store.append_many(
        Fact(user_id="ann", subject="ann", predicate=f"has_{i}", object=o)
        for i, o in enumerate(objects)
    )
    found = await store.recall_scored("a sleepy kitten", limit=70, user_id="ann")
    assert len(found) == 70
    async with vector_engine.connect() as conn:
        rows = (await conn.execute(text("SELECT id, embedding FROM facts"))).all()
    [wanted] = await embedder.embed(["a sleepy kitten"])
    truth = dict(
        zip([r.id for r in rows], cosines(list(wanted), [r.embedding for r in rows]), strict=True)
    )
    shown = [truth[m.fact.id] for m in found]
    assert all(a >= b - 1e-6 for a, b in pairwise(shown)), "by cosine"
    left_out = [c for i, c in truth.items() if i not in {m.fact.id for m in found}]
    assert min(shown) >= max(left_out) - 1e-6, "the nearest 70"
    for match in found:
        assert match.vector_score == pytest.approx(truth[match.fact.id], abs=1e-6)
