"""Without pgvector: the schema still migrates, ``migrate`` says what to install in one line,
and recall falls back to full-text search with a warning given once."""

from __future__ import annotations

import os
import subprocess
import sys

import structlog
from redis.asyncio import Redis
from sqlalchemy import text

from tests.recall_set import Unused, load_recall_set, remember_all
from worker.db.engine import create_database_engine
from worker.db.migrate import head_revision, migrate_reporting
from worker.db.vectors import VECTOR_TABLE, missing_pgvector
from worker.episodes.embedding import Embedder
from worker.episodes.store import EpisodeStore
from worker.settings import Settings


async def test_without_pgvector_recall_falls_back_to_full_text_and_warns_once(
    database_url: str, redis: Redis, settings: Settings
) -> None:
    revision, missing = await migrate_reporting(database_url)
    assert revision == head_revision()
    engine = create_database_engine(database_url)
    try:
        async with engine.begin() as conn:
            has = (
                await conn.execute(
                    text("SELECT 1 FROM pg_available_extensions WHERE name='vector'")
                )
            ).first()
            major = (await conn.execute(text("SHOW server_version_num"))).scalar_one()
            hint = missing_pgvector((int(major) // 10000,))
            if has is None:
                assert missing == hint
                assert f"postgresql-{int(major) // 10000}-pgvector" in hint
                assert "\n" not in missing
            else:  # this server ships pgvector: drop the table, as a server without it has none
                assert missing is None
                await conn.execute(text(f"DROP TABLE {VECTOR_TABLE}"))
        episodes, _queries = load_recall_set()
        await remember_all(engine, redis, settings.stream_prefix, "acme", episodes)
        unused: Embedder = Unused()
        store = EpisodeStore(engine, unused)
        with structlog.testing.capture_logs() as logs:
            first = await store.recall("acme", "login authentication", 3)
            second = await store.recall("acme", "spanish emails", 3)
        assert (
            first[0].episode.task_description == "Fix the login bug in the authentication service"
        )
        assert first[0].vector_rank is None and first[0].text_rank == 1
        assert str(second[0].episode.task_description).startswith("Translate the onboarding")
        warnings = [entry for entry in logs if entry["log_level"] == "warning"]
        assert [w["event"] for w in warnings] == [hint]
        export = await store.export("acme")
        assert len(export.episodes) == len(episodes)
        assert all("embedding" not in e or e["embedding"] is None for e in export.episodes)
    finally:
        await engine.dispose()


async def test_memworker_migrate_says_in_one_line_what_to_install_when_pgvector_is_missing(
    database_url: str,
) -> None:
    env = dict(os.environ, DATABASE_URL=database_url)
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "migrate"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"schema at revision {head_revision()}")
    engine = create_database_engine(database_url)
    try:
        async with engine.connect() as conn:
            table = (await conn.execute(text("SELECT to_regclass('episode_embeddings')"))).scalar()
            major = int((await conn.execute(text("SHOW server_version_num"))).scalar_one()) // 10000
            episodes = (await conn.execute(text("SELECT to_regclass('episodes')"))).scalar()
    finally:
        await engine.dispose()
    assert episodes is not None  # the rest of the schema is there either way
    if table is None:  # a server without pgvector
        [line] = done.stderr.strip().splitlines()
        assert "pgvector is not installed" in line and "install it" in line
        assert f"postgresql-{major}-pgvector package for this PostgreSQL {major}" in line
    else:
        assert done.stderr.strip() == ""
