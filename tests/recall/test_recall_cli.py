"""``memworker recall`` and ``memworker remember`` as a user runs them (subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.recall_set import load_recall_set, remember_all
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.settings import Settings


def memworker(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        REDIS_URL=settings.redis_url,
        DATABASE_URL=settings.database_url,
        MEMWORKER_STREAM_PREFIX=settings.stream_prefix,
        MEMWORKER_LOG_LEVEL="WARNING",
    )
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args], env=env, capture_output=True, text=True
    )


async def test_recall_json_lists_the_projects_best_episodes_first_with_their_fields(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    episodes, _queries = load_recall_set()
    await remember_all(vector_engine, redis, vector_settings.stream_prefix, "acme", episodes)
    await remember_all(vector_engine, redis, vector_settings.stream_prefix, "other", episodes)
    await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
    done = memworker(vector_settings, "recall", "-p", "acme", "users cannot sign in", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # no progress bar of the model's loading either
    hits = json.loads(done.stdout)
    assert len(hits) == 10
    assert hits[0]["task_description"] == "Fix the login bug in the authentication service"
    assert {h["project_id"] for h in hits} == {"acme"}
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)
    for key in ("episode_id", "session_id", "outcome", "lessons_learned", "occurred_at"):
        assert key in hits[0]
    assert -1 <= hits[-1]["similarity"] < hits[0]["similarity"] <= 1
    for key in ("vector_rank", "text_rank", "text_score", "relevance", "agent_type_id"):
        assert key in hits[0]
    strict = memworker(
        vector_settings,
        *("recall", "-p", "acme", "users cannot sign in", "--json", "--min-score", "0.4"),
        *("--outcome", "success", "--since", "1d", "--until", "2099-01-01T00:00:00Z"),
    )
    assert strict.returncode == 0, strict.stderr
    kept = json.loads(strict.stdout)
    assert kept and kept[0]["episode_id"] == hits[0]["episode_id"]
    assert all(h["similarity"] >= 0.4 for h in kept) and len(kept) < len(hits)
    bad = memworker(vector_settings, "recall", "-p", "acme", "x", "--since", "yesterday")
    assert bad.returncode == 2 and "--since" in bad.stderr
    table = memworker(
        vector_settings, "recall", "-p", "acme", "users cannot sign in", "--limit", "2"
    )
    assert table.returncode == 0, table.stderr
    assert "Fix the login bug" in table.stdout


@pytest.mark.usefixtures("redis")  # its teardown deletes the episodes stream `remember` writes
async def test_remember_from_the_shell_is_idempotent_and_a_bad_outcome_is_one_line(
    vector_engine: AsyncEngine, vector_settings: Settings
) -> None:
    args = ("remember", "-p", "acme", "--id", "n1", "--task", "Deploy with a rollback plan")
    first, second = memworker(vector_settings, *args), memworker(vector_settings, *args)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout
    bad = memworker(vector_settings, *args, "--outcome", "great")
    assert bad.returncode == 1
    assert bad.stderr.strip().startswith("memworker: error: outcome must be one of")
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.usefixtures("redis")
async def test_remember_from_the_shell_refuses_an_existing_id_with_other_content(
    vector_engine: AsyncEngine, vector_settings: Settings
) -> None:
    """As ``Memory.remember`` and ``POST /v1/remember`` refuse it: never a silent keep."""
    ident = ("remember", "-p", "demo", "--id", "login-1")
    assert memworker(vector_settings, *ident, "--task", "Fix the login bug").returncode == 0
    for changed in (
        ("--task", "Something else"),
        ("--task", "Fix the login bug", "--lesson", "new"),
        ("--task", "Fix the login bug", "--importance", "0.9"),
    ):
        other = memworker(vector_settings, *ident, *changed)
        assert other.returncode == 1, (changed, other.stdout, other.stderr)
        line = other.stderr.strip()
        assert "\n" not in line, line
        assert line.startswith(
            "memworker: error: episode 'login-1' is already remembered with other content"
        ), line
    found = memworker(vector_settings, "episodes", "list", "-p", "demo", "--json")
    assert found.returncode == 0, found.stderr
    assert [e["task_description"] for e in json.loads(found.stdout)] == ["Fix the login bug"]


async def test_reindex_embeds_beside_another_model_then_deletes_its_vectors_unless_kept(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings
) -> None:
    from sqlalchemy import text

    from worker.db.vectors import store_vectors

    episodes, _queries = load_recall_set()
    ids = await remember_all(
        vector_engine, redis, vector_settings.stream_prefix, "acme", episodes[:4]
    )
    async with vector_engine.begin() as conn:
        await store_vectors(conn, "old-model", 3, list(ids.values()), [[1.0, 0.0, 0.0]] * 4)

    async def models() -> list[str]:
        async with vector_engine.connect() as conn:
            found = await conn.execute(text("SELECT model FROM episode_embeddings ORDER BY 1"))
            return [row[0] for row in found]

    kept = memworker(vector_settings, "reindex", "-p", "acme", "--keep-old")
    assert kept.returncode == 0, kept.stderr
    assert "embedded 4 episodes" in kept.stdout
    assert await models() == ["all-MiniLM-L6-v2"] * 4 + ["old-model"] * 4
    done = memworker(vector_settings, "reindex", "-p", "acme")
    assert done.returncode == 0, done.stderr
    assert "embedded 0 episodes; deleted 4 vectors of other models" in done.stdout
    assert await models() == ["all-MiniLM-L6-v2"] * 4
