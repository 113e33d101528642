"""Forgetting a user never reaches another user's live session that reuses a session id.

A session id may be spawned again once its tombstone is gone (the contract says so). Ann's
session ``reused`` finishes, its tombstone expires, and Bob spawns ``reused``: forgetting Ann
must erase her history of it, never Bob's live working memory nor his later commands.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import text as sql
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.helpers import running_worker, wait_until
from tests.integration.test_client_and_cli import memworker
from tests.integration.test_forget import drained, live
from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.episodes.store import EpisodeStore
from worker.erasure.erased import entry_body
from worker.keys import SessionKeys, is_dlq_stream
from worker.lifecycle.client import LifecycleClient
from worker.memory import WorkingMemory
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

PROJECT = "reuse"
SESSION = "reused"
REUSED = "reuse2"
__all__ = ["live"]


async def test_forgetting_a_user_keeps_another_users_live_session_of_the_same_id(
    redis: Redis, live: Settings
) -> None:
    settings = live.model_copy(update={"tombstone_ttl_seconds": 1, "dedupe_ttl_seconds": 1})
    client = LifecycleClient(redis, settings)
    engine = create_database_engine(settings.database_url)
    try:
        async with running_worker(settings):
            sent = await client.spawn(PROJECT, SESSION, "a", {"ann_secret": "A"}, user_id="ann")
            assert (await client.wait(sent, timeout=10)).type == "agent.spawned"
            sent = await client.terminate(PROJECT, SESSION, "a", lessons_learned=["ann lesson"])
            await client.wait(sent, timeout=10)
            consolidator = Consolidator.from_settings(settings)
            try:
                await consolidator.run_once()
            finally:
                await consolidator.close()
            await drained(redis, settings)
            assert await EpisodeStore(engine).list_episodes(PROJECT, user_id="ann")
            meta = SessionKeys.for_session(
                settings.stream_prefix, settings.shards, PROJECT, SESSION
            ).meta
            for _ in range(100):  # the tombstone expires: the id may be spawned again
                if not await redis.exists(meta):
                    break
                await asyncio.sleep(0.1)
            assert not await redis.exists(meta)
            sent = await client.spawn(PROJECT, SESSION, "b", {"bob_secret": "B"}, user_id="bob")
            assert (await client.wait(sent, timeout=10)).type == "agent.spawned"

            done = await asyncio.to_thread(
                memworker, settings, "forget", "-p", PROJECT, "-u", "ann", "--yes"
            )
            assert done.returncode == 0, done.stderr
            assert not await EpisodeStore(engine).list_episodes(PROJECT, user_id="ann")

            wm = await WorkingMemory.for_session(SESSION, PROJECT, redis=redis, settings=settings)
            assert await wm.get_all() == {"bob_secret": "B"}
            sent = await client.pause(PROJECT, SESSION, "b", description="bob goes on")
            assert (await client.wait(sent, timeout=10)).type == "agent.paused"
    finally:
        await engine.dispose()


async def _all_entries(redis: Redis, prefix: str) -> dict[tuple[str, str], dict[str, object]]:
    """Every stream entry under the prefix: (stream, id) → its body."""
    found: dict[tuple[str, str], dict[str, object]] = {}
    async for raw in redis.scan_iter(match=f"{prefix}:*", _type="stream"):
        name = raw.decode()
        for entry_id, fields in await redis.xrange(name):
            letter = is_dlq_stream(prefix, name)
            found[(name, entry_id.decode())] = entry_body(fields, dead_letter=letter)
    return found


async def _events_by_user(engine: AsyncEngine, project: str) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sql(
                "SELECT coalesce(payload->>'user_id', ''), count(*) FROM lifecycle_events"
                " WHERE project_id = :p GROUP BY 1"
            ),
            {"p": project},
        )
        return {r[0]: r[1] for r in rows}


async def _publish(redis: Redis, settings: Settings, kind: str, session: str, **kw: Any) -> str:
    """One command from a client of its own (as `memworker publish` is: no ``spawn_event_id``,
    so the command names neither its user nor its life), applied."""
    client = LifecycleClient(redis, settings)
    sent = await getattr(client, kind)(REUSED, session, "agent", **kw)
    result = await client.wait(sent, timeout=10)
    return result.type


async def test_forgetting_a_user_keeps_every_entry_and_row_of_the_next_life_of_a_session_id(
    redis: Redis, live: Settings
) -> None:
    """Ann's sessions s1 and s2 finish and are consolidated; their tombstones expire; bob
    spawns s1 (consolidated) and s2 (not yet: the consolidator is stopped), and bob and carol
    remember turns with session id s1. Forgetting ann erases every entry of ann's lives (her
    later commands name no user) and nothing of bob's or carol's: bob's results, commands and
    announcement stay in the streams, his rows in Postgres, his s2 is consolidated after the
    forget, and s1 is not a forgotten marker (a new spawn of it applies)."""
    settings = live.model_copy(update={"tombstone_ttl_seconds": 1, "dedupe_ttl_seconds": 1})
    prefix = settings.stream_prefix
    engine = create_database_engine(settings.database_url)
    memory = Memory(REUSED, settings=settings, engine=engine, redis=redis)

    async def consolidate() -> None:
        consolidator = Consolidator.from_settings(settings)
        try:
            await consolidator.run_once()
        finally:
            await consolidator.close()

    try:
        async with running_worker(settings):
            for s in ("s1", "s2"):
                kind = await _publish(
                    redis, settings, "spawn", s, initial_state={"ann_secret": "A"}, user_id="ann"
                )
                assert kind == "agent.spawned"
                assert await _publish(redis, settings, "pause", s) == "agent.paused"
                assert await _publish(redis, settings, "resume", s) == "agent.resumed"
                kind = await _publish(redis, settings, "terminate", s, lessons_learned=["ann l"])
                assert kind == "agent.terminated"
            await consolidate()
            await drained(redis, settings)
            for s in ("s1", "s2"):
                meta = SessionKeys.for_session(prefix, settings.shards, REUSED, s).meta
                await wait_until(lambda m=meta: _gone(redis, m), timeout=10)
            ann_entries = set(await _all_entries(redis, prefix))
            ann_events = await _events_by_user(engine, REUSED)
            assert ann_events == {"ann": 8}

            for s in ("s1", "s2"):
                kind = await _publish(
                    redis, settings, "spawn", s, initial_state={"bob_secret": "B"}, user_id="bob"
                )
                assert kind == "agent.spawned"
                assert await _publish(redis, settings, "pause", s) == "agent.paused"
                assert await _publish(redis, settings, "resume", s) == "agent.resumed"
                if s == "s1":
                    kind = await _publish(redis, settings, "terminate", s, lessons_learned=["b"])
                    assert kind == "agent.terminated"
                    await consolidate()
                    await drained(redis, settings)
            for user in ("bob", "carol"):
                await memory.remember(
                    Episode(session_id="s1", user_id=user, input=f"{user} asks", output="ok")
                )
            await memory.flush_changes()
            # s2's terminate is applied, but no consolidator reads it before the forget
            kind = await _publish(redis, settings, "terminate", "s2", lessons_learned=["b"])
            assert kind == "agent.terminated"
            before = await _all_entries(redis, prefix)
            others = {k: v for k, v in before.items() if k not in ann_entries}
            assert sum(v.get("type") == "episode.remembered" for v in others.values()) == 2
            assert await _events_by_user(engine, REUSED) == {"ann": 8, "bob": 4}

            # A marker of a wrongly forgotten s1 would outlive the test's checks.
            forget_env = settings.model_copy(update={"tombstone_ttl_seconds": 600})
            done = await asyncio.to_thread(
                memworker, forget_env, "forget", "-p", REUSED, "-u", "ann", "--yes"
            )
            assert done.returncode == 0, done.stderr

            after = await _all_entries(redis, prefix)
            assert {k for k in others if k not in after} == set(), "another user's entry went"
            left = {k for k in ann_entries if k in after and after[k].get("project_id") == REUSED}
            assert left == set(), f"ann's entries left: {sorted(left)}"
            assert await _events_by_user(engine, REUSED) == {"bob": 4}
            for s in ("s1", "s2"):
                meta = SessionKeys.for_session(prefix, settings.shards, REUSED, s).meta
                assert await redis.hget(meta, "state") != b"forgotten", s  # type: ignore[misc]

            await consolidate()  # bob's s2: its results were kept, so its episode comes
            await drained(redis, settings)
            assert await _events_by_user(engine, REUSED) == {"bob": 8}
            bob = await EpisodeStore(engine).list_episodes(REUSED, user_id="bob")
            # s1's second life and s2's: an episode per life of a session id
            assert sorted(e.session_id for e in bob if e.turn_id is None) == ["s1", "s2"]
            assert not await EpisodeStore(engine).list_episodes(REUSED, user_id="ann")
            # bob's s1 tombstone (1 s) expires; a forgotten marker would live 600 s
            meta = SessionKeys.for_session(prefix, settings.shards, REUSED, "s1").meta
            await wait_until(lambda m=meta: _gone(redis, m), timeout=10)
            kind = await _publish(redis, settings, "spawn", "s1", user_id="carol")
            assert kind == "agent.spawned"
    finally:
        await engine.dispose()


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


async def test_a_refused_spawn_of_another_user_starts_no_life(redis: Redis, live: Settings) -> None:
    """Bob's spawn of ann's finished session id is refused (her tombstone is still there);
    ann's late pause, published after it, is still ann's: forgetting ann takes it (command and
    result), and bob's refused spawn (his) stays."""
    prefix = live.stream_prefix
    async with running_worker(live):
        kind = await _publish(redis, live, "spawn", "s3", user_id="ann")
        assert kind == "agent.spawned"
        assert await _publish(redis, live, "terminate", "s3") == "agent.terminated"
        assert await _publish(redis, live, "spawn", "s3", user_id="bob") == "command.rejected"
        assert await _publish(redis, live, "pause", "s3", description="late") == "command.rejected"
        entries = await _all_entries(redis, prefix)
        late = [k for k, v in entries.items() if v.get("description") == "late"]
        assert len(late) == 1
        bobs = [k for k, v in entries.items() if v.get("user_id") == "bob"]
        assert len(bobs) == 2  # his spawn and its rejection

        done = await asyncio.to_thread(
            memworker, live, "forget", "-p", REUSED, "-u", "ann", "--yes"
        )
        assert done.returncode == 0, done.stderr
        after = await _all_entries(redis, prefix)
        assert late[0] not in after, "ann's late pause was left"
        assert all(k in after for k in bobs)
        ann_left = [k for k, v in after.items() if v.get("session_id") == "s3" and k not in bobs]
        assert ann_left == [], ann_left
