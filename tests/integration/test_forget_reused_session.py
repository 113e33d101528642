"""Forgetting a user never reaches another user's live session that reuses a session id.

A session id may be spawned again once its tombstone is gone (the contract says so). Ann's
session ``reused`` finishes, its tombstone expires, and Bob spawns ``reused``: forgetting Ann
must erase her history of it, never Bob's live working memory nor his later commands.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from tests.helpers import running_worker
from tests.integration.test_client_and_cli import memworker
from tests.integration.test_forget import drained, live
from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.episodes.store import EpisodeStore
from worker.keys import SessionKeys
from worker.lifecycle.client import LifecycleClient
from worker.memory import WorkingMemory
from worker.settings import Settings

PROJECT = "reuse"
SESSION = "reused"
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
