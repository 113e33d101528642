"""Forgetting the anonymous bucket (data of no user) never claims another user's terminated
session, on real Redis and Postgres with the lifecycle worker: zed's tombstone keeps zed's
``user_id``, so ``Memory("demo").forget()`` leaves it ``terminated`` with its ``seq`` counter,
and a later terminate is still answered ``already_terminated``; a terminated session whose
spawn named no user is the bucket's, and is marked ``forgotten``. Before, a tombstone kept no
user and the anonymous forget took every one of them."""

from __future__ import annotations

from redis.asyncio import Redis

from tests.helpers import running_worker
from tests.integration.test_forget import live
from worker.keys import SessionKeys
from worker.lifecycle.client import LifecycleClient, seq_key
from worker.settings import Settings
from worker.user_memory.memory import Memory

PROJECT = "demo"
__all__ = ["live"]


async def test_the_anonymous_forget_leaves_another_users_tombstone(
    redis: Redis, live: Settings
) -> None:
    client = LifecycleClient(redis, live)

    def keys(session: str) -> SessionKeys:
        return SessionKeys.for_session(live.stream_prefix, live.shards, PROJECT, session)

    async with running_worker(live):
        for session, user in (("tz-1", "zed"), ("anon-1", None)):
            sent = await client.spawn(PROJECT, session, "a", {"n": 1}, user_id=user)
            assert (await client.wait(sent, timeout=10)).type == "agent.spawned"
            sent = await client.terminate(PROJECT, session, "a")
            assert (await client.wait(sent, timeout=10)).type == "agent.terminated"
        assert await redis.hget(keys("tz-1").meta, "user_id") == b"zed"  # type: ignore[misc]
        zed_seq = seq_key(live.stream_prefix, keys("tz-1").shard, PROJECT, "tz-1")
        assert await redis.exists(zed_seq)

        memory = Memory(PROJECT, settings=live, redis=redis)
        try:
            await memory.forget()  # the anonymous bucket
        finally:
            await memory.close()

        zed = await redis.hgetall(keys("tz-1").meta)  # type: ignore[misc]
        assert zed[b"state"] == b"terminated", zed
        assert await redis.exists(zed_seq), "zed's seq counter went"
        sent = await client.terminate(PROJECT, "tz-1", "a")
        answer = await client.wait(sent, timeout=10)
        assert getattr(answer, "reason", None) == "already_terminated", answer
        anon = await redis.hgetall(keys("anon-1").meta)  # type: ignore[misc]
        assert anon[b"state"] == b"forgotten", anon
