"""deploy/redis/users.acl on a real server: each role does its job and nothing else.

The real code paths run as each user (the lifecycle worker, LifecycleClient, WorkingMemory, the
inspection used by ``memworker stats``); since Redis 7 the ACL also applies to the commands and
keys a Lua script calls, so a script needing more than its caller may do fails here. After the
happy paths the ACL log must be empty: a refused command the code tolerates (and so would hide)
still fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from tests.deploy.acl_redis import AclRedis
from tests.helpers import running_worker, wait_until
from worker.keys import (
    CONSOLIDATION_GROUP,
    LIFECYCLE_GROUP,
    SessionKeys,
    StreamKeys,
    episodes_stream,
)
from worker.lifecycle.client import LifecycleClient, NotReplicatedError
from worker.memory import WorkingMemory
from worker.ops.capacity import measure_capacity
from worker.ops.capacity_sampling import recent_commands_per_session
from worker.ops.inspection import prune_dead_consumers, stream_stats
from worker.redis_conditions import RedisConditionError
from worker.settings import Settings

PREFIX = "agents"  # the prefix the ACL key patterns are written for
SHARDS = 2


def settings_for(server: AclRedis, user: str) -> Settings:
    return Settings(
        redis_url=server.url(user),
        stream_prefix=PREFIX,
        shards=SHARDS,
        reclaim_interval_ms=50,
        retention_interval_seconds=0.1,
    )


def session_keys(project: str, session: str) -> SessionKeys:
    return SessionKeys.for_session(PREFIX, SHARDS, project, session)


@pytest.fixture
async def clients(acl_server: AclRedis) -> AsyncIterator[dict[str, Redis]]:
    """One client per user of the ACL file, logged in as that user."""
    users = [
        "lifecycle-worker",
        "consolidator",
        "publisher",
        "subscriber",
        "agent",
        "operator",
        "keda",
        "healthcheck",
    ]
    opened = {user: Redis.from_url(acl_server.url(user)) for user in users}
    try:
        yield opened
    finally:
        for client in opened.values():
            await client.aclose()


async def denials(admin: Redis) -> list[dict[str, Any]]:
    entries: Any = await admin.acl_log()
    return [e for e in entries if e.get("username") != "default"]


async def assert_no_denials(admin: Redis) -> None:
    found = await denials(admin)
    summary = [(e["username"], e["reason"], e["object"], e["context"]) for e in found]
    assert summary == [], f"commands refused by the ACL: {summary}"


async def refused(call: Any) -> None:
    with pytest.raises(NoPermissionError):
        await call


async def refused_in_script(call: Any) -> None:
    """A script's command the user may not run: Redis answers an ACL failure in the script."""
    with pytest.raises(ResponseError, match="ACL failure in script"):
        await call


async def test_the_default_user_is_disabled_so_a_client_without_credentials_is_refused(
    acl_server: AclRedis,
) -> None:
    anonymous = Redis.from_url(acl_server.anonymous_url)
    try:
        with pytest.raises(AuthenticationError):
            await anonymous.ping()  # type: ignore[misc]
    finally:
        await anonymous.aclose()
    wrong = Redis.from_url(acl_server.url("publisher", "not-the-password"))
    try:
        with pytest.raises(AuthenticationError):
            await wrong.ping()  # type: ignore[misc]
    finally:
        await wrong.aclose()


async def test_the_publisher_may_wait_for_replicas(acl_server: AclRedis) -> None:
    """``publish(replicas=1)`` sends WAIT as the publisher: allowed (no replica here: 0)."""
    publisher = LifecycleClient(settings=settings_for(acl_server, "publisher"))
    try:
        with pytest.raises(NotReplicatedError) as raised:
            await publisher.publish(
                {
                    "type": "spawn",
                    "project_id": "p-acl",
                    "session_id": "s-wait",
                    "agent_instance_id": "agent-1",
                },
                replicas=1,
                replicas_timeout=0.2,
            )
        assert raised.value.acknowledged == 0
    finally:
        await publisher.close()


async def test_commands_published_as_the_publisher_are_applied_by_the_worker_as_lifecycle_worker(
    acl_server: AclRedis, admin: Redis
) -> None:
    publisher = LifecycleClient(settings=settings_for(acl_server, "publisher"))
    worker_settings = settings_for(acl_server, "lifecycle-worker")
    try:
        async with running_worker(worker_settings) as worker:
            for session in ("s-1", "s-2", "s-3"):
                spawned = await publisher.wait(
                    await publisher.spawn("p-acl", session, "agent-1", {"goal": "ship", "n": 1})
                )
                assert spawned.type == "agent.spawned", spawned
                paused = await publisher.wait(
                    await publisher.pause("p-acl", session, "agent-1", checkpoint_id="cp-1")
                )
                assert paused.type == "agent.paused", paused
                resumed = await publisher.wait(await publisher.resume("p-acl", session, "agent-1"))
                assert resumed.type == "agent.resumed", resumed
                ended = await publisher.wait(
                    await publisher.terminate(
                        "p-acl", session, "agent-1", lessons_learned=["least privilege works"]
                    )
                )
                assert ended.type == "agent.terminated", ended
            # A rejection (state machine) and a duplicate take the script's other paths.
            again = await publisher.wait(await publisher.pause("p-acl", "s-1", "agent-1"))
            assert again.type == "command.rejected"

            # Junk on the lifecycle stream goes to the DLQ through the dead-letter script.
            shard = 0
            lifecycle = StreamKeys(PREFIX, shard).lifecycle
            await publisher.redis.xadd(lifecycle, {"data": b"not json"})
            dlq = StreamKeys(PREFIX, shard).dlq

            async def dead_lettered() -> bool:
                return int(await admin.xlen(dlq)) == 1

            await wait_until(dead_lettered, timeout=20)

            # The background loops (reclaim, retention, lag and capacity probe) run as the
            # same user.
            assert await worker.loop.reclaim(whole=True) >= 0
            assert await worker.trim_once() >= 0
            await worker.probe_lag()
            assert worker.capacity.enabled, "the capacity sampling was refused"
            measured = worker.capacity.probe.last
            assert measured is not None and measured.used_memory > 0
            # Commands per session from the stream (what a layout without dedupe keys uses).
            assert await recent_commands_per_session(worker.redis, worker_settings) == 14 / 3
    finally:
        await publisher.close()
    await assert_no_denials(admin)


async def test_a_spawn_naming_a_user_is_applied_and_a_forgotten_users_refused(
    acl_server: AclRedis, admin: Redis
) -> None:
    """The apply function reads the shard's forgotten users (``agents:{i}:erased_users``) for
    every spawn that names a user: allowed to ``lifecycle-worker`` (read only). Before, the
    read was refused, so such a spawn was never applied (the worker retried it)."""
    from worker.keys import erased_users_key

    shard = session_keys("p-usr", "s-2").shard
    await admin.hset(erased_users_key(PREFIX, shard), "p-usr@gone", str(2**50))  # type: ignore[misc]
    publisher = LifecycleClient(settings=settings_for(acl_server, "publisher"))
    try:
        async with running_worker(settings_for(acl_server, "lifecycle-worker")):
            spawned = await publisher.wait(
                await publisher.spawn("p-usr", "s-1", "agent-1", {"n": 1}, user_id="ann")
            )
            assert (spawned.type, spawned.user_id) == ("agent.spawned", "ann"), spawned
            refused_spawn = await publisher.wait(
                await publisher.spawn("p-usr", "s-2", "agent-1", {"n": 1}, user_id="gone")
            )
            assert refused_spawn.type == "command.rejected", refused_spawn
            assert refused_spawn.reason == "forgotten", refused_spawn
    finally:
        await publisher.close()
    await assert_no_denials(admin)
    redis = Redis.from_url(acl_server.url("lifecycle-worker"))
    try:  # read only: a forget (the operator) records erasures, never the worker
        await refused(redis.hset(erased_users_key(PREFIX, shard), "p-usr@ann", "1"))
    finally:
        await redis.aclose()


async def test_admission_closes_and_reopens_with_the_shipped_rules(
    acl_server: AclRedis, admin: Redis
) -> None:
    # Near maxmemory the worker (as lifecycle-worker) closes admission, the publisher's script
    # reads it and refuses clearly, an orchestrator's own XADD is applied and its entry deleted
    # under pressure; nothing is refused by the ACL on the way.
    publisher = LifecycleClient(settings=settings_for(acl_server, "publisher"))
    worker_settings = settings_for(acl_server, "lifecycle-worker").model_copy(
        update={"admission_interval_ms": 50}
    )
    try:
        async with running_worker(worker_settings) as worker:
            await publisher.wait(await publisher.spawn("p-adm", "s-1", "agent-1", {"n": 1}))
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory", str(used * 21 // 20))
            try:
                await wait_until(lambda: _is(worker.admission.closed), timeout=20)
                with pytest.raises(RedisConditionError, match="Redis is nearly full"):
                    await publisher.spawn("p-adm", "s-2", "agent-1", {"n": 1})
                keys = session_keys("p-adm", "s-1")
                own = await publisher.redis.xadd(
                    keys.streams.lifecycle,
                    {
                        "data": orjson.dumps(
                            {
                                "type": "pause",
                                "event_id": "own-pause",
                                "project_id": "p-adm",
                                "session_id": "s-1",
                                "agent_instance_id": "agent-1",
                            }
                        )
                    },
                )
                paused = await publisher.wait("own-pause", project_id="p-adm", session_id="s-1")
                assert paused.type == "agent.paused", paused
                assert await admin.xrange(keys.streams.lifecycle, own, own) == []
            finally:
                await admin.config_set("maxmemory", "0")
            await wait_until(lambda: _is(not worker.admission.closed), timeout=20)
            spawned = await publisher.wait(
                await publisher.spawn("p-adm", "s-2", "agent-1", {"n": 1})
            )
            assert spawned.type == "agent.spawned", spawned
            assert not worker.admission.refused
    finally:
        await publisher.close()
    await assert_no_denials(admin)


async def _is(value: bool) -> bool:
    return value


async def test_the_publisher_cannot_read_working_memory_or_delete_streams(
    acl_server: AclRedis, admin: Redis, clients: dict[str, Redis]
) -> None:
    keys = session_keys("p-pub", "s-1")
    await admin.hset(keys.meta, mapping={"state": "active"})  # type: ignore[misc]
    await admin.hset(keys.vars, mapping={"secret": '"token"'})  # type: ignore[misc]
    streams = keys.streams
    await admin.xadd(streams.results, {"data": b"{}"})
    publisher = clients["publisher"]

    assert await publisher.xadd(streams.lifecycle, {"data": b"{}"})
    assert await publisher.incr(f"{PREFIX}:{{{keys.shard}}}:seq:p-pub/s-1") == 1
    assert await publisher.xread({streams.results: "0-0"}, count=1)

    await refused(publisher.hgetall(keys.vars))
    await refused(publisher.hget(keys.meta, "state"))
    await refused(publisher.get(keys.task))
    await refused(publisher.delete(streams.lifecycle))
    await refused(publisher.delete(streams.results))
    await refused(publisher.xtrim(streams.lifecycle, maxlen=0))
    await refused(publisher.xdel(streams.lifecycle, "0-1"))
    await refused(publisher.xadd(streams.results, {"data": b"{}"}))
    await refused(publisher.xadd(streams.dlq, {"data": b"{}"}))
    # It may read the command streams it writes (its EVALSHA publish needs read+write access
    # to the declared keys), but never results' or DLQ writes, nor working memory.
    await refused(publisher.xgroup_destroy(streams.lifecycle, LIFECYCLE_GROUP))
    await refused(publisher.eval("return redis.call('HGETALL', KEYS[1])", 1, keys.vars))
    # the sequence counters' writes are its only SET/PEXPIRE: a leaked orchestrator credential
    # cannot expire, overwrite or replace a command stream, nor do it from a script
    await refused(publisher.pexpire(streams.lifecycle, 1))
    await refused(publisher.set(streams.lifecycle, "junk"))
    await refused(publisher.set(f"{PREFIX}:lifecycle:{{9}}", "junk"))
    # SET only on a session's publish records (``seq:<project>/<session>/pub``), never on a
    # counter (a stored non-integer would break the session's publishes) nor on any other name
    await refused(publisher.set(f"{PREFIX}:{{anything at all}}:seq:junk", "x"))
    await refused(publisher.set(f"{PREFIX}:{{{keys.shard}}}:seq:p-pub/s-1", "junk"))
    await refused_in_script(
        publisher.eval(
            "return redis.call('SET', KEYS[1], 'x')", 1, f"{PREFIX}:{{{keys.shard}}}:seq:p-pub/s-1"
        )
    )
    await refused(publisher.incr(f"{PREFIX}:lifecycle:{{9}}"))
    await refused_in_script(
        publisher.eval("return redis.call('SET', KEYS[1], 'x')", 1, f"{PREFIX}:lifecycle:{{9}}")
    )
    await refused_in_script(
        publisher.eval("return redis.call('PEXPIRE', KEYS[1], 1)", 1, streams.lifecycle)
    )
    assert await admin.exists(streams.lifecycle) == 1
    await refused(publisher.keys("*"))
    await refused(publisher.flushall())


async def test_the_publisher_adds_entries_to_command_streams_only_never_at_a_seq_counter(
    acl_server: AclRedis, admin: Redis, clients: dict[str, Redis]
) -> None:
    """A stream added at a session's seq counter (or its publish records) would make every
    later publish of that session fail (INCR on a stream): the publisher's XADD reaches the
    command streams only, from a script too, and its publishes still go through. Before, its
    XADD reached every key it may write, the counters included."""
    publisher = clients["publisher"]
    counter = f"{PREFIX}:{{0}}:seq:p-pub/s-1"
    for key in (counter, f"{counter}/pub", f"{PREFIX}:{{1}}:seq:another"):
        await refused(publisher.xadd(key, {"data": b"{}"}))
        await refused_in_script(
            publisher.eval("return redis.call('XADD', KEYS[1], '*', 'data', '{}')", 1, key)
        )
        assert await admin.exists(key) == 0
    await admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]
    client = LifecycleClient(settings=settings_for(acl_server, "publisher"))
    try:
        assert await client.spawn("p-pub", "s-1", "agent-1", {"n": 1})
        assert await client.pause("p-pub", "s-1", "agent-1")
    finally:
        await client.close()
    shard = session_keys("p-pub", "s-1").shard
    assert await admin.xlen(StreamKeys(PREFIX, shard).lifecycle) == 2
    assert await admin.get(f"{PREFIX}:{{{shard}}}:seq:p-pub/s-1") == b"2"
    await assert_no_denials(admin)


async def test_a_subscriber_follows_results_in_its_own_group_but_cannot_write(
    acl_server: AclRedis, admin: Redis, clients: dict[str, Redis]
) -> None:
    streams = StreamKeys(PREFIX, 1)
    result = {"type": "agent.spawned", "event_id": "r-1", "causation_id": "c-1"}
    await admin.xadd(streams.results, {"data": orjson.dumps(result)})
    await admin.xgroup_create(streams.results, CONSOLIDATION_GROUP, id="0", mkstream=True)
    subscriber = LifecycleClient(clients["subscriber"], settings_for(acl_server, "subscriber"))
    follower: Any = subscriber.follow(streams.results, "audit", "audit-1", block_ms=100)
    second = {**result, "event_id": "r-2", "causation_id": "c-2"}
    try:
        entry_id, data = await anext(follower)
        assert data == result
        await admin.xadd(streams.results, {"data": orjson.dumps(second)})
        second_id, data = await anext(follower)  # asking for it acknowledged the first
        assert data == second
    finally:
        await follower.aclose()  # at a yield: no read in flight to cancel
    pending: Any = await admin.xpending_range(streams.results, "audit", min="-", max="+", count=9)
    assert [p["message_id"].decode() for p in pending] == [second_id]  # only the one in hand

    redis = clients["subscriber"]
    episodes = episodes_stream(PREFIX)
    await admin.xadd(episodes, {"data": b'{"type": "episode.recorded"}'})
    assert await redis.xread({episodes: "0-0"})
    assert await redis.xrange(streams.results)

    await refused(redis.xadd(streams.results, {"data": b"{}"}))
    await refused(redis.xadd(episodes, {"data": b"{}"}))
    await refused(redis.xadd(streams.lifecycle, {"data": b"{}"}))
    await refused(redis.set(f"{PREFIX}:anything", "x"))
    await refused(redis.hset(session_keys("p-sub", "s-1").vars, "k", "v"))
    await refused(redis.hgetall(session_keys("p-sub", "s-1").vars))
    await refused(redis.delete(streams.results))
    await refused(redis.xdel(streams.results, entry_id))
    await refused(redis.xtrim(streams.results, maxlen=0))
    await refused(redis.xgroup_destroy(streams.results, CONSOLIDATION_GROUP))
    await refused(redis.xgroup_setid(streams.results, CONSOLIDATION_GROUP, "$"))
    await refused(redis.xautoclaim(streams.results, CONSOLIDATION_GROUP, "thief", 0))
    await refused(redis.xreadgroup(LIFECYCLE_GROUP, "x", {streams.lifecycle: ">"}))


async def test_an_agent_uses_its_working_memory_but_cannot_publish_or_read_results(
    acl_server: AclRedis, admin: Redis, clients: dict[str, Redis]
) -> None:
    publisher = LifecycleClient(settings=settings_for(acl_server, "publisher"))
    try:
        async with running_worker(settings_for(acl_server, "lifecycle-worker")):
            spawned = await publisher.wait(
                await publisher.spawn("p-agent", "s-1", "agent-1", {"goal": "write tests"})
            )
            assert spawned.type == "agent.spawned"
    finally:
        await publisher.close()

    memory = await WorkingMemory.for_session(
        "s-1", project_id="p-agent", settings=settings_for(acl_server, "agent")
    )
    try:
        assert await memory.get("goal") == "write tests"
        await memory.set("step", 2)
        await memory.append_scratchpad("tried the obvious thing")
        await memory.set_task_state(description="write tests", progress_percent=0.5)
        assert sorted(await memory.list_keys()) == ["goal", "step"]
        checkpoint = await memory.create_checkpoint("before the risky part")
        await memory.set("step", 3)
        await memory.restore_checkpoint(checkpoint)
        assert await memory.get("step") == 2
        assert await memory.get_stats()
    finally:
        await memory.close()
    await assert_no_denials(admin)

    agent = clients["agent"]
    streams = session_keys("p-agent", "s-1").streams
    await refused(agent.xadd(streams.lifecycle, {"data": b"{}"}))
    await refused(agent.xread({streams.results: "0-0"}))
    await refused(agent.get(f"{PREFIX}:{{0}}:evt:p-agent/e-1"))
    await refused(agent.incr(f"{PREFIX}:{{0}}:seq:p-agent/s-1"))
    await refused(agent.delete(streams.lifecycle))


async def test_an_agent_cannot_rewrite_a_sessions_owner_or_state(
    acl_server: AclRedis, admin: Redis, clients: dict[str, Redis]
) -> None:
    """A session's owner (``user_id``), state and seq are fields of its ``meta`` hash, which
    the agent's working memory never writes: every write of it (HSET, HDEL, DEL, RESTORE,
    SET, from a script too) is refused to the ``agent`` user, while every working-memory call
    (the byte count included) still runs. Before, the agent could make another user the owner
    of any session, and the session's next results named that user."""
    publisher = LifecycleClient(settings=settings_for(acl_server, "publisher"))
    try:
        async with running_worker(settings_for(acl_server, "lifecycle-worker")):
            spawned = await publisher.wait(
                await publisher.spawn("p-own", "s-1", "agent-1", {"goal": "g"}, user_id="ann")
            )
            assert spawned.type == "agent.spawned"
    finally:
        await publisher.close()
    memory = await WorkingMemory.for_session(
        "s-1", project_id="p-own", settings=settings_for(acl_server, "agent")
    )
    try:
        await memory.set("step", 1)
        await memory.set("short", "lived", ttl_seconds=60)
        assert await memory.delete("short")
        checkpoint = await memory.create_checkpoint("before")
        await memory.set("step", 2)
        await memory.restore_checkpoint(checkpoint, clear_current=False)
        await memory.restore_checkpoint(checkpoint)
        assert await memory.get("step") == 1
        assert await memory.delete_checkpoint(checkpoint)
        assert await memory.clear() == 2
        await memory.set("after", "clear")
        assert await memory.get_stats()
    finally:
        await memory.close()
    await assert_no_denials(admin)

    agent = clients["agent"]
    meta = session_keys("p-own", "s-1").meta
    dumped = await admin.dump(meta)
    await refused(agent.hset(meta, "user_id", "mallory"))
    await refused(agent.hset(meta, "state", "active"))
    await refused(agent.hdel(meta, "user_id"))
    await refused(agent.delete(meta))
    await refused(agent.set(meta, "x"))
    await refused(agent.restore(meta, 0, dumped, replace=True))
    rewrite = await agent.script_load("return redis.call('HSET', KEYS[1], 'user_id', 'mallory')")
    await refused_in_script(agent.evalsha(rewrite, 1, meta))
    assert await admin.hget(meta, "user_id") == b"ann"  # type: ignore[misc]
    assert await admin.hget(meta, "state") == b"active"  # type: ignore[misc]


async def test_the_lifecycle_worker_user_cannot_reach_beyond_its_streams_and_sessions(
    clients: dict[str, Redis],
) -> None:
    redis = clients["lifecycle-worker"]
    await refused(redis.xadd(episodes_stream(PREFIX), {"data": b"{}"}))
    await refused(redis.incr(f"{PREFIX}:{{0}}:seq:p/s"))
    await refused(redis.set("other-app:key", "x"))
    await refused(redis.xrange(StreamKeys(PREFIX, 0).dlq))  # it writes the DLQ, never reads it
    await refused(redis.xadd(StreamKeys(PREFIX, 0).lifecycle, {"data": b"{}"}))  # no commands
    await refused(redis.delete(StreamKeys(PREFIX, 0).lifecycle))  # DEL only on session keys
    await refused(redis.set(StreamKeys(PREFIX, 0).results, "x"))
    await refused(redis.hset(f"{PREFIX}:lifecycle:other", "k", "v"))
    await refused(redis.flushall())
    await refused(redis.config_get("*"))
    await refused(redis.script_flush())


async def test_the_consolidator_user_cannot_write_working_memory_or_commands(
    clients: dict[str, Redis],
) -> None:
    redis = clients["consolidator"]
    keys = session_keys("p-con", "s-1")
    await refused(redis.hset(keys.vars, "k", "v"))
    await refused(redis.xadd(keys.streams.lifecycle, {"data": b"{}"}))
    await refused(redis.xadd(keys.streams.results, {"data": b"{}"}))
    await refused(redis.delete(keys.streams.results))
    await refused(redis.unlink(keys.streams.results))
    # forget runs as the operator: the consolidator reads session keys (export), never deletes
    await refused(redis.unlink(keys.meta))
    await refused(redis.unlink(keys.vars))
    await refused(redis.get(keys.streams.results))
    await refused(redis.xrange(keys.streams.dlq))
    await refused(redis.evalsha("0" * 40, 0))


async def test_the_operator_inspects_streams_but_cannot_flush_or_change_users(
    acl_server: AclRedis, admin: Redis, clients: dict[str, Redis]
) -> None:
    streams = StreamKeys(PREFIX, 0)
    await admin.xadd(streams.lifecycle, {"data": b"{}"})
    await admin.xgroup_create(streams.lifecycle, LIFECYCLE_GROUP, id="0")
    operator = clients["operator"]
    rows = await stream_stats(operator, settings_for(acl_server, "operator"))
    assert any(r.stream == streams.lifecycle and r.length == 1 for r in rows)
    # memworker stats: capacity sampling and pruning dead consumers.
    capacity = await measure_capacity(
        operator, settings_for(acl_server, "operator"), rate_seconds=0
    )
    assert capacity.used_memory > 0 and capacity.bytes_per_lifecycle_entry
    await admin.xgroup_createconsumer(streams.lifecycle, LIFECYCLE_GROUP, "gone")
    await asyncio.sleep(1.1)
    pruned = await prune_dead_consumers(operator, settings_for(acl_server, "operator"), 1)
    assert pruned == [(streams.lifecycle, LIFECYCLE_GROUP, "gone")]
    assert await operator.xrange(streams.lifecycle)
    await refused(operator.flushall())
    await refused(operator.flushdb())
    await refused(operator.keys("*"))
    await refused(operator.config_set("appendonly", "no"))
    await refused(operator.acl_setuser("intruder", enabled=True, nopass=True))
    await refused(operator.set("other-app:key", "x"))


async def test_the_operators_commands_work_but_it_cannot_move_keys_to_another_database(
    acl_server: AclRedis, admin: Redis, clients: dict[str, Redis], database_url: str
) -> None:
    """What the operator's commands call (stats, replay, the DLQ's list, redrive and purge,
    forget) works as the shipped ``operator`` (in database 0: no ``SELECT`` needed); ``MOVE``,
    ``COPY … DB`` and ``SELECT``, which would take memworker's keys to another database, where
    no forget, retention or stats looks, are refused, from a script too. Before, the
    operator's categories allowed all three."""
    from tests.integration.results_factory import migrated_engine
    from worker.consumers.dead_letters import list_dead_letters, purge, redrive
    from worker.erasure.forget import forget_everywhere
    from worker.lifecycle.replay import replay_lifecycle

    settings = settings_for(acl_server, "operator")
    publisher = LifecycleClient(settings=settings_for(acl_server, "publisher"))
    try:
        async with running_worker(settings_for(acl_server, "lifecycle-worker")):
            spawned = await publisher.wait(
                await publisher.spawn("p-op", "s-1", "agent-1", {"secret": "kept"})
            )
            assert spawned.type == "agent.spawned"
            streams = session_keys("p-op", "s-1").streams
            await admin.xadd(streams.lifecycle, {"data": b"not json"})

            async def dead_lettered() -> bool:
                return int(await admin.xlen(streams.dlq)) == 1

            await wait_until(dead_lettered, timeout=20)
    finally:
        await publisher.close()
    operator = clients["operator"]
    await admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]

    assert any(r.stream == streams.lifecycle for r in await stream_stats(operator, settings))
    replayed = await replay_lifecycle(operator, settings, session_keys("p-op", "s-1").shard)
    assert replayed["duplicate"] == 1, replayed
    ((letter_id, _fields),) = await list_dead_letters(operator, streams.dlq)
    assert await redrive(operator, streams.dlq, [letter_id]) == 1
    assert await purge(operator, streams.dlq) == 0
    async with migrated_engine(database_url) as engine:
        receipt = await forget_everywhere(
            engine, operator, PREFIX, "p-op", session_id="s-1", shards=SHARDS
        )
    assert receipt.ok, receipt.errors
    await assert_no_denials(admin)

    vars_key = session_keys("p-op", "s-2").vars
    await admin.hset(vars_key, "secret", '"kept"')  # type: ignore[misc]
    await refused(operator.move(vars_key, 1))
    await refused(operator.copy(vars_key, f"{vars_key}-copy", destination_db="1"))
    await refused(operator.execute_command("SELECT", 1))  # type: ignore[no-untyped-call]
    await refused_in_script(operator.eval("return redis.call('MOVE', KEYS[1], 1)", 1, vars_key))
    assert await admin.hget(vars_key, "secret") == b'"kept"'  # type: ignore[misc]
    other_database = Redis.from_url(acl_server.admin_url.removesuffix("/0") + "/1")
    try:
        assert await other_database.dbsize() == 0, "a key reached another database"
    finally:
        await other_database.aclose()


async def test_keda_reads_backlog_counts_and_nothing_else(
    admin: Redis, clients: dict[str, Redis]
) -> None:
    streams = StreamKeys(PREFIX, 0)
    await admin.xadd(streams.lifecycle, {"data": b"{}"})
    await admin.xgroup_create(streams.lifecycle, LIFECYCLE_GROUP, id="0")
    keda = clients["keda"]
    assert await keda.xlen(streams.lifecycle) == 1
    groups: Any = await keda.xinfo_groups(streams.lifecycle)
    assert groups[0]["lag"] == 1
    summary: Any = await keda.xpending(streams.lifecycle, LIFECYCLE_GROUP)
    assert summary["pending"] == 0
    await refused(keda.xreadgroup(LIFECYCLE_GROUP, "keda", {streams.lifecycle: ">"}))
    await refused(keda.xrange(streams.lifecycle))
    await refused(keda.xadd(streams.lifecycle, {"data": b"{}"}))
    await refused(keda.hgetall(session_keys("p", "s").vars))


async def test_the_healthcheck_user_may_only_ping(clients: dict[str, Redis]) -> None:
    health = clients["healthcheck"]
    assert await health.ping()  # type: ignore[misc]
    await refused(health.get(f"{PREFIX}:anything"))
    await refused(health.xlen(StreamKeys(PREFIX, 0).lifecycle))


async def test_a_worker_user_from_an_acl_file_without_the_apply_function_is_told_what_to_add(
    acl_server: AclRedis, admin: Redis
) -> None:
    """An ACL file written before the apply function became one (no FCALL, no FUNCTION LOAD):
    the worker does not start, and says which permissions its user lacks and where they are."""
    from worker.errors import one_line
    from worker.lifecycle.worker import LifecycleWorker

    rules = shipped_rules("lifecycle-worker")
    old = [r for r in rules if r not in ("+fcall", "+function|load") and not r.startswith("#")]
    await admin.execute_command("ACL", "SETUSER", "old-worker", "reset", ">old", *old)  # type: ignore[no-untyped-call]
    settings = settings_for(acl_server, "lifecycle-worker").model_copy(
        update={"redis_url": acl_server.url("old-worker", "old")}
    )
    worker = LifecycleWorker(settings)
    with pytest.raises(ResponseError) as refused:
        await worker.start()
    await worker.stop()
    message = one_line(refused.value)
    assert "NOPERM" in message and "function|load" in message
    assert "deploy/redis/users.acl" in message and "+fcall +function|load" in message


async def test_a_publisher_from_an_acl_file_without_admission_still_publishes(
    acl_server: AclRedis, admin: Redis
) -> None:
    """An ACL file written before admission (no access to agents:admission:*): publishing goes
    on, refused by Redis itself at maxmemory only, rather than failing with NOPERM."""
    rules = shipped_rules("publisher")
    old = [r for r in rules if "admission" not in r and not r.startswith("#")]
    await admin.execute_command("ACL", "SETUSER", "old-publisher", "reset", ">old", *old)  # type: ignore[no-untyped-call]
    settings = settings_for(acl_server, "publisher").model_copy(
        update={"redis_url": acl_server.url("old-publisher", "old")}
    )
    publisher = LifecycleClient(settings=settings)
    try:
        assert await publisher.spawn("p-old", "s-1", "agent-1", {"n": 1})
    finally:
        await publisher.close()
    await admin.execute_command("ACL", "DELUSER", "old-publisher")  # type: ignore[no-untyped-call]
    await admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]


def shipped_rules(user: str) -> list[str]:
    """The rules deploy/redis/users.acl gives ``user``, one per item (a selector "(…)" is one)."""
    import re
    from pathlib import Path

    acl = Path(__file__).resolve().parents[2] / "deploy" / "redis" / "users.acl"
    line = next(row for row in acl.read_text().splitlines() if f" {user} " in row)
    return re.findall(r"\([^)]*\)|\S+", line)[2:]


async def test_a_trim_through_xadd_maxlen_no_acl_can_refuse_is_shown_to_the_operator(
    acl_server: AclRedis, admin: Redis, clients: dict[str, Redis]
) -> None:
    """An ACL cannot refuse an argument: a publisher may trim a command stream with ``XADD …
    MAXLEN`` and the consolidator ``agents:episodes`` (deploy/redis/README.md says so). The
    commands it dropped unread show in ``memworker stats`` (as the operator runs it)."""
    from worker.episodes.indexer import INDEXER_GROUP

    lifecycle = StreamKeys(PREFIX, 0).lifecycle
    episodes = episodes_stream(PREFIX)
    await admin.xgroup_create(lifecycle, LIFECYCLE_GROUP, id="0", mkstream=True)
    await admin.xgroup_create(episodes, INDEXER_GROUP, id="0", mkstream=True)
    publisher, consolidator = clients["publisher"], clients["consolidator"]
    for n in range(3):
        await publisher.xadd(lifecycle, {"data": str(n).encode()})
        await consolidator.xadd(episodes, {"data": str(n).encode()})
    await admin.xreadgroup(LIFECYCLE_GROUP, "worker-1", {lifecycle: ">"}, count=1)
    settings = settings_for(acl_server, "operator")
    assert not any(r.removed_unread for r in await stream_stats(clients["operator"], settings))

    await publisher.xadd(lifecycle, {"data": b"x"}, maxlen=1, approximate=False)
    await consolidator.xadd(episodes, {"data": b"x"}, maxlen=0, approximate=False)
    assert await admin.xlen(lifecycle) == 1 and await admin.xlen(episodes) == 0
    rows = await stream_stats(clients["operator"], settings)
    assert {(r.stream, r.group) for r in rows if r.removed_unread} == {
        (lifecycle, LIFECYCLE_GROUP),
        (episodes, INDEXER_GROUP),
    }


async def test_the_operator_stops_a_script_that_never_returns_run_by_a_role_that_may_script(
    admin: Redis, clients: dict[str, Redis]
) -> None:
    """A script-running credential can hold Redis BUSY with a loop; the operator can kill it."""
    agent, operator = clients["agent"], clients["operator"]
    sha = await agent.script_load("while true do end")

    async def loop() -> Any:
        return await agent.evalsha(sha, 0)  # type: ignore[misc]

    looping = asyncio.create_task(loop())

    async def busy() -> bool:
        try:
            await operator.get("agents:probe")
        except Exception as error:  # redis-py has no class of its own for BUSY
            return "BUSY" in str(error)
        return False

    try:
        await wait_until(busy, timeout=30)
        await operator.script_kill()
        with pytest.raises(ResponseError, match="killed"):
            await looping
        assert await operator.get("agents:probe") is None  # Redis answers again
    finally:
        if not looping.done():
            with contextlib.suppress(Exception):
                await admin.script_kill()  # never leave the shared server looping
            looping.cancel()
