"""deploy/postgres/roles.sql on a real Postgres: the owner migrates, the runtime role only works.

Setup as in a deployment: roles.sql as an admin, ``memworker migrate`` as memworker_owner,
roles.sql again. The roles are cluster-wide; the test sets their passwords (so it also works on
a server with password authentication) and drops them afterwards when nothing else uses them.
"""

from __future__ import annotations

import contextlib
import importlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import make_url

from tests.deploy.acl_redis import AclRedis
from tests.helpers import running_worker
from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.db.migrate import migrate
from worker.db.vectors import ensure_dimension_index
from worker.episodes.announcements import Announcement
from worker.episodes.indexer import Indexer
from worker.episodes.store import EpisodeStore
from worker.keys import StreamKeys, episodes_stream, shard_of
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings

asyncpg: Any = importlib.import_module("asyncpg")  # untyped: imported as Any, not stubbed
ROLES_SQL = Path(__file__).resolve().parents[2] / "deploy" / "postgres" / "roles.sql"
ROW_TABLES = ("lifecycle_events", "episodes", "memory_blocks", "facts", "memory_changes")
"""The tables the runtime role reads, writes and deletes rows of (forget deletes)."""
EMBEDDINGS = {
    (table, p)
    for table in ("episode_embeddings", "episode_chunk_embeddings")
    for p in ("SELECT", "INSERT", "DELETE")
}
"""pgvector's tables: a turn's vector, and its long output's chunk vectors."""
OWNER = "memworker_owner"
RUNTIME = "memworker_runtime"


@dataclass(frozen=True)
class RoleUrls:
    admin: str
    owner: str
    runtime: str


def as_role(url: str, role: str, password: str) -> str:
    return make_url(url).set(username=role, password=password).render_as_string(False)


def dsn(url: str) -> str:
    """An asyncpg DSN for a SQLAlchemy URL (``postgresql+asyncpg://`` → ``postgresql://``)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def run_roles_sql(admin_url: str, owner_password: str, runtime_password: str) -> None:
    conn = await asyncpg.connect(dsn(admin_url))
    try:
        await conn.execute(
            "SELECT set_config('memworker.owner_password', $1, false)", owner_password
        )
        await conn.execute(
            "SELECT set_config('memworker.runtime_password', $1, false)", runtime_password
        )
        await conn.execute(ROLES_SQL.read_text(encoding="utf-8"))
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def deployed(database_url: str) -> AsyncIterator[RoleUrls]:
    """As in a deployment: roles.sql as an admin, ``memworker migrate`` as the owner (with
    ``dimension``'s vector index), roles.sql again; the roles' objects dropped afterwards."""
    owner_password = "owner-" + uuid.uuid4().hex
    runtime_password = "runtime-" + uuid.uuid4().hex
    await run_roles_sql(database_url, owner_password, runtime_password)
    urls = RoleUrls(
        admin=database_url,
        owner=as_role(database_url, OWNER, owner_password),
        runtime=as_role(database_url, RUNTIME, runtime_password),
    )
    await migrate(urls.owner)
    await run_roles_sql(database_url, owner_password, runtime_password)
    try:
        yield urls
    finally:
        conn = await asyncpg.connect(dsn(database_url))
        try:
            await conn.execute(f"DROP OWNED BY {OWNER}, {RUNTIME} CASCADE")
            # Kept when another database still uses them (another test run, a deployment).
            with contextlib.suppress(asyncpg.PostgresError):
                await conn.execute(f"DROP ROLE {RUNTIME}, {OWNER}")
        finally:
            await conn.close()


@pytest.fixture
async def roles(database_url: str) -> AsyncIterator[RoleUrls]:
    async with deployed(database_url) as urls:
        yield urls


@pytest.fixture
async def vector_roles(pgvector_admin_url: str) -> AsyncIterator[RoleUrls]:
    """``roles`` in a fresh database of a server with pgvector."""
    name = "memworker_r" + uuid.uuid4().hex[:12]
    admin = await asyncpg.connect(dsn(pgvector_admin_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            async with deployed(
                make_url(pgvector_admin_url).set(database=name).render_as_string(False)
            ) as urls:
                yield urls
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def connect(url: str) -> Any:
    return await asyncpg.connect(dsn(url))


async def denied(conn: Any, sql: str, *args: Any) -> None:
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await conn.execute(sql, *args)


async def test_the_migration_runs_as_the_owner_role_which_owns_every_table(roles: RoleUrls) -> None:
    conn = await connect(roles.owner)
    try:
        rows = await conn.fetch(
            "SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'memworker'"
        )
        assert {r["tablename"] for r in rows} >= {"lifecycle_events", "episodes", "alembic_version"}
        assert {r["tableowner"] for r in rows} == {OWNER}
        assert await conn.fetchval("SHOW search_path") == "memworker"
        await denied(conn, "CREATE ROLE memworker_intruder")
        await denied(conn, "CREATE DATABASE memworker_intruder")
    finally:
        await conn.close()


async def test_the_runtime_role_writes_rows_but_cannot_drop_alter_or_create(
    roles: RoleUrls,
) -> None:
    conn = await connect(roles.runtime)
    try:
        await conn.execute(
            "INSERT INTO lifecycle_events (event_id, type, causation_id, occurred_at, payload)"
            " VALUES ('e-1', 'agent.spawned', 'c-1', now(), '{}') ON CONFLICT DO NOTHING"
        )
        episode_id = uuid.uuid4()
        await conn.execute(
            "INSERT INTO episodes (id, source_event_id, project_id, session_id, outcome,"
            " context_summary, importance_score, occurred_at)"
            " VALUES ($1, 'e-2', 'p', 's', 'success', 'done', 0.5, now())"
            " ON CONFLICT DO NOTHING RETURNING id",
            episode_id,
        )
        await conn.execute("UPDATE episodes SET announced_at = now() WHERE id = $1", episode_id)
        assert await conn.fetchval("SELECT count(*) FROM lifecycle_events") == 1
        assert await conn.fetchval("SELECT version_num FROM alembic_version")

        for sql in (
            "DROP TABLE episodes",
            "DROP TABLE lifecycle_events",
            "DROP TABLE alembic_version",
            "ALTER TABLE episodes ADD COLUMN intruder int",
            "ALTER TABLE lifecycle_events DROP COLUMN payload",
            "TRUNCATE lifecycle_events",
            "CREATE TABLE memworker.intruder (id int)",
            "CREATE TABLE public.intruder (id int)",
            "CREATE SCHEMA intruder",
            "CREATE INDEX intruder ON episodes (outcome)",
            "UPDATE episodes SET outcome = 'failure'",
            "UPDATE lifecycle_events SET payload = '{}'",
            "DELETE FROM alembic_version",
            "UPDATE alembic_version SET version_num = 'x'",
        ):
            await denied(conn, sql)

        assert await conn.fetchval("DELETE FROM episodes WHERE project_id = 'p' RETURNING 1")
        assert await conn.fetchval("DELETE FROM lifecycle_events RETURNING 1")
    finally:
        await conn.close()


async def test_roles_sql_runs_again_without_changing_any_privilege(roles: RoleUrls) -> None:
    query = (
        "SELECT table_name, privilege_type FROM information_schema.role_table_grants"
        " WHERE grantee = $1 ORDER BY 1, 2"
    )
    conn = await connect(roles.admin)
    try:
        before = [tuple(r) for r in await conn.fetch(query, RUNTIME)]
        await run_roles_sql(roles.admin, "", "")  # empty: leave the passwords as they are
        after = [tuple(r) for r in await conn.fetch(query, RUNTIME)]
    finally:
        await conn.close()
    assert before == after
    rows = {
        (table, privilege) for table in ROW_TABLES for privilege in ("SELECT", "INSERT", "DELETE")
    }
    assert set(before) - EMBEDDINGS == rows | {
        ("alembic_version", "SELECT"),
        ("erasures", "INSERT"),
        ("erasures", "SELECT"),
    }
    # the vector tables exist only where the server has pgvector (its own test below)
    assert set(before) & EMBEDDINGS in (set(), EMBEDDINGS)
    check = await connect(roles.runtime)  # the password set first still works
    await check.close()


async def test_the_consolidator_runs_as_the_runtime_role_and_its_own_redis_user(
    roles: RoleUrls, acl_server: AclRedis, admin: Redis
) -> None:
    def settings_as(user: str) -> Settings:
        return Settings(
            redis_url=acl_server.url(user),
            database_url=roles.runtime,
            stream_prefix="agents",
            shards=2,
        )

    publisher = LifecycleClient(settings=settings_as("publisher"))
    try:
        async with running_worker(settings_as("lifecycle-worker")):
            for session in ("s-1", "s-2"):
                await publisher.wait(await publisher.spawn("p-db", session, "a-1", {"n": 1}))
                ended = await publisher.wait(
                    await publisher.terminate(
                        "p-db", session, "a-1", task_description="consolidate me", cleanup=False
                    )
                )
                assert ended.type == "agent.terminated"
    finally:
        await publisher.close()
    junk_stream = StreamKeys("agents", 0)
    await admin.xadd(junk_stream.results, {"data": b"not json"})

    consolidator = Consolidator.from_settings(settings_as("consolidator"))
    try:
        finished = await consolidator.run_once()
    finally:
        await consolidator.close()
    assert finished == 5  # 2 spawned, 2 terminated, 1 dead-lettered

    engine = create_database_engine(roles.runtime)
    redis = Redis.from_url(acl_server.url("operator"))  # forget is an operator's command
    try:
        store = EpisodeStore(engine)
        episodes = await store.list_episodes("p-db")
        assert sorted(e.session_id for e in episodes) == ["s-1", "s-2"]
        assert all(e.announced_at is not None for e in episodes)
        forgotten = await store.forget("p-db", redis=redis, prefix="agents")
        assert (forgotten.episodes, forgotten.lifecycle_events) == (2, 4)
        assert forgotten.redis_keys > 0
    finally:
        await redis.aclose()
        await engine.dispose()

    announced: Any = await admin.xrange(episodes_stream("agents"))
    # The two episode.recorded went with the project; one memory.forgotten (ids, counts) came
    assert [orjson.loads(f[b"data"])["type"] for _i, f in announced] == ["memory.forgotten"]
    dead: Any = await admin.xrange(junk_stream.dlq)
    assert [orjson.loads(f[b"data"]) for _i, f in dead] == [{"data": "not json"}]
    left = [k async for k in admin.scan_iter(match="agents:{*}:s:p-db/*")]
    assert sorted(left) == sorted(
        f"agents:{{{shard_of('p-db', s, 2)}}}:s:p-db/{s}:meta".encode() for s in ("s-1", "s-2")
    )  # the forgotten sessions' markers
    assert all([await admin.hget(k, "state") == b"forgotten" for k in left])  # type: ignore[misc]
    log: Any = await admin.acl_log()
    assert [(e["username"], e["object"]) for e in log] == []


async def test_roles_sql_creates_pgvector_and_the_indexer_embeds_as_the_runtime_role(
    vector_roles: RoleUrls, acl_server: AclRedis, admin: Redis
) -> None:
    """pgvector is not a trusted extension: roles.sql (the superuser's step) creates it, so the
    owner's migration gets the vector table; the indexer writes vectors as the runtime role
    and its own Redis user, and never tries to create an index it may not (one exists)."""
    runtime = await connect(vector_roles.runtime)
    try:
        assert (
            await runtime.fetchval(
                "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'vector'"
            )
            == "memworker"
        )
        episode_id = uuid.uuid4()
        await runtime.execute(
            "INSERT INTO episodes (id, source_event_id, project_id, session_id, outcome,"
            " context_summary, importance_score, occurred_at, task_description)"
            " VALUES ($1, 'e-1', 'p-ix', 's-1', 'success', 'done', 0.5, now(), $2)",
            episode_id,
            "repair the continuous deployment job",
        )
    finally:
        await runtime.close()
    recorded = Announcement(episode_id, "p-ix", "s-1", "e-1")
    await admin.xadd(episodes_stream("agents"), {"data": recorded.wire()})  # the consolidator's

    settings = Settings(
        redis_url=acl_server.url("indexer"),
        database_url=vector_roles.runtime,
        stream_prefix="agents",
    )
    indexer = Indexer.from_settings(settings)
    try:
        assert await indexer.run_once() == 1
    finally:
        await indexer.close()
    runtime = await connect(vector_roles.runtime)
    try:
        assert await runtime.fetchval("SELECT count(*) FROM episode_embeddings") == 1
        # another model's dimension: only the owner may create its index, and says so
        engine = create_database_engine(vector_roles.runtime)
        try:
            async with engine.begin() as conn:
                why = await ensure_dimension_index(conn, 768)
        finally:
            await engine.dispose()
        assert why is not None and "memworker migrate as the schema owner" in why
    finally:
        await runtime.close()
    await migrate(vector_roles.owner, dimension=768)
    owner = await connect(vector_roles.owner)
    try:
        assert await owner.fetchval("SELECT to_regclass('ix_episode_embeddings_hnsw_768')")
    finally:
        await owner.close()
    log: Any = await admin.acl_log()
    assert [(e["username"], e["object"]) for e in log] == []
