"""Forget one user while traffic runs (issue 23, item 4, with ``--user``): the worker, the
consolidator and the indexer run, commands for both users' sessions keep arriving and the kept
user's turns keep being remembered; nothing of the forgotten user comes back through any
replay, nothing of the other is lost."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from tests.helpers import running_worker
from tests.integration.test_client_and_cli import memworker
from tests.integration.test_forget import drained, live, redis_copies, services, table_copies
from tests.integration.test_forget_user import (
    ANN,
    BOB,
    FINISHED,
    LIVE,
    PROJECT,
    ann_anywhere,
    replay_everything,
    seed_memory,
    seed_sessions,
)
from worker.db.engine import create_database_engine
from worker.episodes.store import EpisodeStore
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

__all__ = ["live"]


async def traffic(redis: Redis, settings: Settings, memory: Memory, stop: asyncio.Event) -> int:
    """Until ``stop``: new sessions and turns of bob's, and pauses and resumes (with content)
    of ann's live sessions."""
    client = LifecycleClient(redis, settings)
    n = 0
    while not stop.is_set():
        await client.spawn(PROJECT, f"{BOB}-t{n}", "a", {"note": f"keep-t{n}"}, user_id=BOB)
        await client.terminate(PROJECT, f"{BOB}-t{n}", "a", task_description=f"rainbow t{n}")
        await memory.remember(
            Episode(session_id=f"{BOB}-live", user_id=BOB, input=f"rainbow q{n}", output="a")
        )
        s = f"{ANN}-s{FINISHED + n % LIVE}"
        await client.resume(PROJECT, s, "a", metadata={"note": f"SECRET-ann-traffic-{n}"})
        await client.pause(PROJECT, s, "a", description=f"SECRET-ann-traffic-{n}")
        n += 1
        await asyncio.sleep(0.01)
    return n


async def test_forget_one_user_under_traffic_loses_nothing_of_the_other(
    redis: Redis, live: Settings
) -> None:
    client = LifecycleClient(redis, live)
    engine = create_database_engine(live.database_url)
    store = EpisodeStore(engine)
    memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
    try:
        async with running_worker(live), services(live):
            await seed_sessions(client, ANN)
            await seed_sessions(client, BOB)
            await seed_memory(memory, ANN)
            await seed_memory(memory, BOB)
            await drained(redis, live)

            stop = asyncio.Event()
            sending = asyncio.create_task(traffic(redis, live, memory, stop))
            await asyncio.sleep(0.5)
            done = await asyncio.to_thread(
                memworker, live, "forget", "-p", PROJECT, "-u", ANN, "--yes"
            )
            await asyncio.sleep(0.5)  # commands for ann's sessions keep arriving
            stop.set()
            sent = await sending
            assert sent > 3
            await drained(redis, live)
        assert done.returncode == 0, done.stderr

        await replay_everything(redis, live)
        leaks = ann_anywhere(
            await redis_copies(redis, live.stream_prefix), await table_copies(live)
        )
        assert not leaks, leaks[:5]
        assert await store.list_episodes(PROJECT, user_id=ANN) == []
        bob_sessions = {
            e.session_id for e in await store.list_episodes(PROJECT, user_id=BOB, limit=10_000)
        }
        # every bob session: the seeded finished ones, each traffic session, and his turns
        assert {f"{BOB}-s{n}" for n in range(FINISHED)} <= bob_sessions
        assert {f"{BOB}-t{n}" for n in range(sent)} <= bob_sessions
        turns = await memory.export(user_id=BOB)
        assert sum(e.session_id == f"{BOB}-live" for e in turns.episodes) == sent
    finally:
        await memory.close()
        await engine.dispose()
