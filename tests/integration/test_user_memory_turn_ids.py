"""A turn's id is unique per (project, user), on real Redis and Postgres: two users (and the
anonymous bucket) each hold ``turn-1``, no conflict and nothing said of the other's, and each
recalls, exports and forgets only their own; one user's id again is once with the same content
and a conflict with other content; turns stored before migration 0007 keep their ids and are
found by their user."""

from __future__ import annotations

import asyncio
import uuid
import warnings
from typing import Any

import orjson
import pytest
from alembic import command
from redis.asyncio import Redis
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration import test_user_memory
from tests.integration.test_user_memory import PROJECT, T, feed
from worker.db.engine import create_database_engine
from worker.db.migrate import alembic_config, migrate
from worker.db.models import EPISODE_NAMESPACE
from worker.keys import episodes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode
from worker.user_memory.turns import EpisodeConflictError, turn_uuid

engine = test_user_memory.engine  # its fixtures: a migrated database, a Memory of PROJECT
um_settings = test_user_memory.um_settings
memory = test_user_memory.memory


def turn(turn_id: str, user: str | None, words: str, session: str = "s-1") -> Episode:
    return Episode(
        id=turn_id, session_id=session, user_id=user, occurred_at=T, input=words, output="ok"
    )


async def rows(engine: AsyncEngine, turn_id: str) -> dict[str | None, str]:
    """user -> row id of the project's turns of ``turn_id``."""
    async with engine.connect() as conn:
        found = await conn.execute(
            text("SELECT user_id, id::text FROM episodes WHERE project_id = :p AND turn_id = :t"),
            {"p": PROJECT, "t": turn_id},
        )
        return {row.user_id: row.id for row in found}


async def test_two_users_each_hold_an_id_and_see_only_their_own(
    memory: Memory, engine: AsyncEngine, redis: Redis, um_settings: Settings
) -> None:
    ann = turn("turn-1", "ann", "my invoice total is 42 EUR")
    bob = turn("turn-1", "bob", "my dentist appointment is on monday")
    nobody = turn("turn-1", None, "the weather in porto is sunny")
    for each in (ann, bob, nobody):
        assert await memory.remember(each) == "turn-1"
    for each in (ann, bob, nobody):  # a retry of each: the same turn, nothing more
        assert await memory.remember(each) == "turn-1"
    stored = await rows(engine, "turn-1")
    assert set(stored) == {"ann", "bob", None} and len(set(stored.values())) == 3

    for user, own in (("ann", ann), ("bob", bob), (None, nobody)):
        assert (await memory.export(user_id=user)).episodes == [own]
    assert await memory.recall("invoice total", user_id="bob") == [bob]  # his own, at best
    assert await memory.recall("dentist appointment", user_id="bob") == [bob]
    assert await memory.recall("", user_id="ann") == [ann]
    with warnings.catch_warnings(record=True):
        assert await memory.recall("", user_id=None) == [nobody]
    remembered = [e for e in await feed(redis, um_settings) if e["type"] == "episode.remembered"]
    assert [(e["user_id"], e["episode_id"]) for e in remembered] == [
        ("ann", "turn-1"),
        ("bob", "turn-1"),
        (None, "turn-1"),
    ]

    with pytest.raises(EpisodeConflictError) as conflict:  # his own id, other content
        await memory.remember(bob.model_copy(update={"output": "changed"}))
    assert "ann" not in str(conflict.value)
    assert (await memory.export(user_id="bob")).episodes == [bob]

    assert await memory.forget(user_id="bob") == 1
    assert await rows(engine, "turn-1") == {"ann": stored["ann"], None: stored[None]}
    assert (await memory.export(user_id="ann")).episodes == [ann]
    assert await memory.remember(bob) == "turn-1"  # bob may remember it again


async def test_batches_concurrent_calls_and_a_sessions_forget_keep_users_apart(
    memory: Memory, engine: AsyncEngine
) -> None:
    a, b = turn("t-2", "ann", "ann's words"), turn("t-2", "bob", "bob's words")
    assert await memory.remember_many([a, b, a]) == ["t-2"] * 3
    assert set(await rows(engine, "t-2")) == {"ann", "bob"}
    with pytest.raises(EpisodeConflictError, match=r"episodes\[1\].*episodes\[0\]"):
        await memory.remember_many([turn("t-3", "ann", "one"), turn("t-3", "ann", "two")])

    calls = [
        memory.remember(turn("t-4", user, f"{user}'s turn"))
        for user in ("ann", "bob", "ann", None, "bob")
    ]
    assert await asyncio.gather(*calls) == ["t-4"] * 5  # one round: no user's is another's
    assert set(await rows(engine, "t-4")) == {"ann", "bob", None}

    assert await memory.forget(user_id="ann", session_id="s-1") == 2
    assert set(await rows(engine, "t-2")) == {"bob"}
    assert sorted(e.id for e in (await memory.export(user_id="bob")).episodes) == ["t-2", "t-4"]


# -- turns stored before migration 0007 -------------------------------------------------------

_OLD_TURN = text(
    "INSERT INTO episodes (id, source_event_id, project_id, session_id, user_id, turn_id, input,"
    " output, outcome, lessons_learned, context_summary, importance_score, occurred_at,"
    " announced_at) VALUES (:id, :src, :p, 's-1', :u, :t, :i, 'ok', 'turn', '[]'::jsonb, '',"
    " 0.5, :at, CASE WHEN :owed THEN NULL ELSE now() END)"
)
"""A turn as the writer before 0007 stored it: its id and source from the project and id."""


def old_row_id(turn_id: str) -> str:
    return str(uuid.uuid5(EPISODE_NAMESPACE, f"turn:{PROJECT}/{turn_id}"))


def _downgrade(connection: Connection) -> None:
    command.downgrade(alembic_config(connection), "0006")


async def test_turns_stored_before_0007_keep_their_ids_and_are_found_by_their_user(
    database_url: str, redis: Redis, um_settings: Settings
) -> None:
    assert await migrate(database_url, "0006") == "0006"
    engine = create_database_engine(database_url)
    try:
        old: list[tuple[str | None, str, bool]] = [
            ("ann", "old-1", False),
            ("bob", "old-2", True),  # its episode.recorded still owed
            (None, "old-3", False),
        ]
        async with engine.begin() as conn:
            for user, turn_id, owed in old:
                await conn.execute(
                    _OLD_TURN,
                    {
                        "id": old_row_id(turn_id),
                        "src": f"turn:{PROJECT}/{turn_id}",
                        "p": PROJECT,
                        "u": user,
                        "t": turn_id,
                        "i": f"{user}'s {turn_id}",
                        "at": T,
                        "owed": owed,
                    },
                )
        await migrate(database_url)
        for user, turn_id, _owed in old:
            assert await rows(engine, turn_id) == {user: old_row_id(turn_id)}

        async with Memory(PROJECT, settings=um_settings, engine=engine, redis=redis) as memory:
            for user, turn_id, _owed in old:  # the same turn again: it, with its old id
                assert await memory.remember(turn(turn_id, user, f"{user}'s {turn_id}")) == turn_id
                assert await rows(engine, turn_id) == {user: old_row_id(turn_id)}
            # the owed one was announced under its old id, and marked (announcements follow
            # a remember's return: flushed here)
            await memory.flush_changes()
            entries: Any = await redis.xrange(episodes_stream(um_settings.stream_prefix))
            announced = [orjson.loads(f[b"data"])["episode_id"] for _i, f in entries]
            assert announced == [old_row_id("old-2")]
            async with engine.connect() as conn:
                unannounced = "SELECT count(*) FROM episodes WHERE announced_at IS NULL"
                assert await conn.scalar(text(unannounced)) == 0

            with pytest.raises(EpisodeConflictError):
                await memory.remember(turn("old-1", "ann", "other words"))
            # ann's old id is no one else's: bob and the anonymous bucket each take it
            assert await memory.remember(turn("old-1", "bob", "bob's words")) == "old-1"
            assert await memory.remember(turn("old-1", None, "nobody's words")) == "old-1"
            assert await rows(engine, "old-1") == {
                "ann": old_row_id("old-1"),
                "bob": str(turn_uuid(PROJECT, "bob", "old-1")),
                None: str(turn_uuid(PROJECT, None, "old-1")),
            }
            assert [e.id for e in (await memory.export(user_id="ann")).episodes] == ["old-1"]
            assert [e.input for e in await memory.recall("", user_id="ann")] == ["ann's old-1"]

        async with engine.connect() as conn:  # the old key cannot hold them: refused
            with pytest.raises(Exception, match="more than one user of a project"):
                await conn.run_sync(_downgrade)
    finally:
        await engine.dispose()
