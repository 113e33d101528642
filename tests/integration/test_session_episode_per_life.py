"""A session id spawned again (a new life) gets an episode of its own, with its own user.

Ann's session ``s1`` ends; once its tombstone is gone, Bob spawns ``s1`` again and ends it.
Both lives are consolidated: two episodes, each with its user, two ``episode.recorded``. A
replay (of the stream, after a Postgres restore lost the episodes, and of owed announcements)
still gives exactly two, and forgetting one user leaves the other's episode.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from alembic import command
from redis.asyncio import Redis
from sqlalchemy import Connection
from sqlalchemy import text as sql

from tests.helpers import all_results, running_worker, wait_until
from tests.integration.test_client_and_cli import memworker
from tests.integration.test_results_replay import (
    consolidate,
    forget_announcements,
    published,
    replay,
)
from worker.db.engine import create_database_engine
from worker.db.migrate import alembic_config, current_revision, head_revision, migrate
from worker.keys import SessionKeys, episodes_stream
from worker.lifecycle.client import LifecycleClient
from worker.lifecycle.result_ids import life_of
from worker.settings import Settings

PROJECT = "lives"
SESSION = "s1"


@pytest.fixture
async def live(settings: Settings, database_url: str) -> Settings:
    await migrate(database_url)
    return settings.model_copy(
        update={"database_url": database_url, "tombstone_ttl_seconds": 1, "dedupe_ttl_seconds": 1}
    )


async def two_lives(redis: Redis, settings: Settings) -> None:
    """Ann's life of ``s1`` ends and its tombstone expires; Bob's life of ``s1`` ends."""
    client = LifecycleClient(redis, settings)
    meta = SessionKeys.for_session(settings.stream_prefix, settings.shards, PROJECT, SESSION).meta

    async def gone() -> bool:
        return not await redis.exists(meta)

    async with running_worker(settings):
        for user in ("ann", "bob"):
            await wait_until(gone, timeout=30)  # ann's tombstone first
            sent = await client.spawn(PROJECT, SESSION, "a", {"note": user}, user_id=user)
            assert (await client.wait(sent, timeout=10)).type == "agent.spawned"
            sent = await client.terminate(
                PROJECT, SESSION, "a", task_description=f"{user}'s task", lessons_learned=[user]
            )
            assert (await client.wait(sent, timeout=10)).type == "agent.terminated"


async def session_episodes(settings: Settings) -> list[tuple[str | None, str, str]]:
    """``(user_id, task_description, snapshot's note)`` of the project's session episodes."""
    engine = create_database_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                sql(
                    "SELECT user_id, task_description, snapshot->'variables'->>'note' FROM episodes"
                    " WHERE project_id = :p AND session_id = :s AND turn_id IS NULL ORDER BY 1"
                ),
                {"p": PROJECT, "s": SESSION},
            )
            return [(r[0], r[1], r[2]) for r in rows]
    finally:
        await engine.dispose()


async def episode_ids(settings: Settings) -> dict[str, str]:
    """The session episode's id of each user's life of ``s1``."""
    engine = create_database_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                sql(
                    "SELECT user_id, id::text FROM episodes"
                    " WHERE project_id = :p AND session_id = :s AND turn_id IS NULL"
                ),
                {"p": PROJECT, "s": SESSION},
            )
            return {r[0]: r[1] for r in rows}
    finally:
        await engine.dispose()


async def recorded(redis: Redis, settings: Settings) -> list[dict[str, Any]]:
    return [
        e
        for e in await published(redis, episodes_stream(settings.stream_prefix))
        if e.get("type") == "episode.recorded" and e.get("session_id") == SESSION
    ]


BOTH = [("ann", "ann's task", "ann"), ("bob", "bob's task", "bob")]


async def test_each_life_of_a_session_id_is_an_episode_of_its_own_user(
    redis: Redis, live: Settings
) -> None:
    await two_lives(redis, live)
    await consolidate(live)
    assert await session_episodes(live) == BOTH
    announced = await recorded(redis, live)
    assert len(announced) == 2
    assert len({e["episode_id"] for e in announced}) == 2

    # Delivered again (the same results, a replay of the stream): nothing more.
    assert (await replay(live))["new_episodes"] == 0
    await consolidate(live)
    assert await session_episodes(live) == BOTH
    assert len(await recorded(redis, live)) == 2

    # A crash between COMMIT and the announcements: a replay announces each life once.
    await forget_announcements(live, PROJECT)
    done = await replay(live)
    assert done["new_episodes"] == 2
    assert len(await recorded(redis, live)) == 4
    assert (await replay(live))["new_episodes"] == 0
    assert len(await recorded(redis, live)) == 4


async def test_a_replay_after_a_restore_rebuilds_both_lives_once(
    redis: Redis, live: Settings
) -> None:
    """Postgres lost the episodes (a restore from before them): a replay of the results
    stream rebuilds one per life, each with its own snapshot; a second replay adds none."""
    await two_lives(redis, live)
    await consolidate(live)
    engine = create_database_engine(live.database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sql("DELETE FROM episodes WHERE project_id = :p"), {"p": PROJECT})
    finally:
        await engine.dispose()
    assert await session_episodes(live) == []
    assert (await replay(live))["new_episodes"] == 2
    assert await session_episodes(live) == BOTH
    assert (await replay(live))["new_episodes"] == 0
    assert await session_episodes(live) == BOTH


@pytest.mark.parametrize(
    ("forgotten", "kept"), [("ann", ("bob", "bob's task", "bob")), ("bob", BOTH[0])]
)
async def test_forgetting_one_users_life_keeps_the_others_episode(
    redis: Redis, live: Settings, forgotten: str, kept: tuple[str, str, str]
) -> None:
    await two_lives(redis, live)
    await consolidate(live)
    assert await session_episodes(live) == BOTH
    ids = await episode_ids(live)
    done = await asyncio.to_thread(
        memworker, live, "forget", "-p", PROJECT, "-u", forgotten, "--yes"
    )
    assert done.returncode == 0, done.stderr
    assert await session_episodes(live) == [kept]
    # The other life's announcement stays on P:episodes; the forgotten one's goes.
    assert [e["episode_id"] for e in await recorded(redis, live)] == [ids[kept[0]]]


async def test_forgetting_a_users_life_of_the_session_keeps_the_other_life(
    redis: Redis, live: Settings
) -> None:
    await two_lives(redis, live)
    await consolidate(live)
    assert await session_episodes(live) == BOTH
    done = await asyncio.to_thread(
        memworker, live, "forget", "-p", PROJECT, "-s", SESSION, "-u", "bob", "--yes"
    )
    assert done.returncode == 0, done.stderr
    assert await session_episodes(live) == [BOTH[0]]


async def test_the_terminated_result_names_the_life_that_ended(
    redis: Redis, live: Settings
) -> None:
    await two_lives(redis, live)
    found = [r for r in await all_results(redis, live) if r.get("session_id") == SESSION]
    spawns = [r["causation_id"] for r in found if r["type"] == "agent.spawned"]
    ended = [r["life"] for r in found if r["type"] == "agent.terminated"]
    assert ended == [life_of(spawn) for spawn in spawns]
    assert len(set(ended)) == 2


def _downgrade(connection: Connection) -> None:
    command.downgrade(alembic_config(connection), "0008")


_OLD_EPISODE = sql(
    "INSERT INTO episodes (id, source_event_id, project_id, session_id, user_id, outcome,"
    " task_description, context_summary, importance_score, occurred_at)"
    " VALUES (gen_random_uuid(), 'ann-terminated', :p, :s, 'ann', 'success', 'ann''s task',"
    " 'ann', 0.5, now())"
)


async def test_an_episode_from_before_0009_keeps_its_life_and_a_new_life_is_added(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """Ann's episode stored before migration 0009 is its session id's one life (``''``);
    Bob's later life of the id gets its own. Downgrading refuses while both are there (0008
    keeps one per session id), and works once one is gone."""
    assert await migrate(database_url, "0008") == "0008"
    live = settings.model_copy(update={"database_url": database_url})
    engine = create_database_engine(database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(_OLD_EPISODE, {"p": PROJECT, "s": SESSION})
        await migrate(database_url)
        client = LifecycleClient(redis, live)
        async with running_worker(live):
            sent = await client.spawn(PROJECT, SESSION, "a", {"note": "bob"}, user_id="bob")
            assert (await client.wait(sent, timeout=10)).type == "agent.spawned"
            sent = await client.terminate(PROJECT, SESSION, "a", task_description="bob's task")
            assert (await client.wait(sent, timeout=10)).type == "agent.terminated"
        await consolidate(live)
        async with engine.connect() as conn:
            lives = dict(
                (r[0], r[1])
                for r in await conn.execute(
                    sql("SELECT user_id, life FROM episodes WHERE project_id = :p"), {"p": PROJECT}
                )
            )
        assert set(lives) == {"ann", "bob"}
        assert lives["ann"] == ""
        assert len(lives["bob"]) == 16

        async with engine.connect() as conn:
            with pytest.raises(RuntimeError, match="more than one life"):
                await conn.run_sync(_downgrade)
        async with engine.begin() as conn:
            await conn.execute(sql("DELETE FROM episodes WHERE user_id = 'bob'"))
        async with engine.begin() as conn:
            await conn.run_sync(_downgrade)
        assert await current_revision(database_url) == "0008"
        assert await migrate(database_url) == head_revision()
        async with engine.connect() as conn:
            left = (await conn.execute(sql("SELECT user_id, life FROM episodes"))).all()
        assert [tuple(r) for r in left] == [("ann", "")]
    finally:
        await engine.dispose()
