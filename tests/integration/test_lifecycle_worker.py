"""The lifecycle worker against a real Redis: every result, every rejection, recovery."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from faststream.redis import RedisBroker
from redis.asyncio import Redis

from schemas.results import RESULT_ADAPTER
from tests.helpers import (
    command,
    dead_letters,
    publish,
    results,
    running_worker,
    stream_len_at_least,
    wait_until,
)
from worker.consumers.groups import ensure_group
from worker.keys import LIFECYCLE_GROUP, SessionKeys, StreamKeys, shard_of
from worker.settings import Settings


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """Settings with short recovery timings, so recovery paths run within a test."""
    return settings.model_copy(
        update={
            "reclaim_idle_ms": 300,
            "reclaim_interval_ms": 100,
            "seq_retry_ms": 20,
            "seq_gap_timeout_seconds": 1.0,
            "max_deliveries": 3,
        }
    )


async def run_commands(
    redis: Redis, settings: Settings, bodies: list[Any], expect_results: int, expect_dead: int = 0
) -> list[dict[str, Any]]:
    for body in bodies:
        await publish(redis, settings, body, shard=0 if isinstance(body, bytes) else None)
    streams = StreamKeys(settings.stream_prefix, 0)
    async with running_worker(settings):
        await stream_len_at_least(redis, streams.results, expect_results)
        if expect_dead:
            await stream_len_at_least(redis, streams.dlq, expect_dead)
        await asyncio.sleep(0.1)
    return await results(redis, settings)


async def test_a_session_lifecycle_yields_one_valid_result_per_command(
    redis: Redis, settings: Settings
) -> None:
    out = await run_commands(
        redis,
        settings,
        [
            command(
                "spawn",
                "e1",
                initial_state={"goal": "find x", "n": 3},
                seq=1,
                correlation_id="corr-1",
                metadata={"team": "a"},
                agent_type_id="planner",
            ),
            command("pause", "e2", seq=2, description="lunch"),
            command("resume", "e3", seq=3),
            command(
                "terminate",
                "e4",
                seq=4,
                outcome="partial",
                lessons_learned=["be brief"],
                tokens_used=42,
                task_description="find x",
                importance=0.9,
            ),
        ],
        expect_results=4,
    )
    assert [r["type"] for r in out] == [
        "agent.spawned",
        "agent.paused",
        "agent.resumed",
        "agent.terminated",
    ]
    for r in out:
        RESULT_ADAPTER.validate_python(r)
    spawned, paused, resumed, terminated = out
    assert spawned["initial_items"] == 2
    assert spawned["correlation_id"] == "corr-1"
    assert spawned["metadata"] == {"team": "a"}
    assert spawned["agent_type_id"] == "planner"
    assert spawned["causation_id"] == "e1"
    assert paused["items_saved"] == 2
    assert resumed["checkpoint_id"] == paused["checkpoint_id"]
    assert resumed["items_restored"] == 2
    assert terminated["outcome"] == "partial"
    assert terminated["snapshot"]["variables"] == {"goal": "find x", "n": 3}
    assert terminated["snapshot"]["checkpoints"] == [paused["checkpoint_id"]]
    assert terminated["items_cleared"] == 2
    assert terminated["lessons_learned"] == ["be brief"]
    assert terminated["tokens_used"] == 42
    assert terminated["duration_seconds"] >= 0
    keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", "s1")
    assert await redis.hget(keys.meta, "state") == b"terminated"  # type: ignore[misc]
    assert not await redis.exists(keys.vars, keys.cps, keys.cpdata)
    assert await redis.pttl(keys.meta) > 0, "the tombstone must expire"


async def test_result_ids_are_deterministic_from_the_command(
    redis: Redis, settings: Settings
) -> None:
    from worker.lifecycle.result_ids import result_event_id

    out = await run_commands(redis, settings, [command("spawn", "e1")], expect_results=1)
    assert out[0]["event_id"] == result_event_id("p1", "e1")


async def test_a_command_published_twice_has_one_effect_and_one_result(
    redis: Redis, settings: Settings
) -> None:
    spawn = command("spawn", "dup-1", initial_state={"a": 1})
    bodies = [spawn, spawn, command("pause", "dup-2"), command("pause", "dup-2")]
    await run_commands(redis, settings, bodies, expect_results=2)
    await asyncio.sleep(0.2)
    out = await results(redis, settings)
    assert [r["causation_id"] for r in out] == ["dup-1", "dup-2"]
    pending = await redis.xpending(StreamKeys(settings.stream_prefix, 0).lifecycle, LIFECYCLE_GROUP)
    assert pending["pending"] == 0, "duplicates are acknowledged too"


@pytest.mark.parametrize(
    ("bodies", "reason", "detail_mentions"),
    [
        ([command("pause", "r1")], "unknown_session", "spawn it first"),
        ([command("spawn", "r0"), command("spawn", "r1")], "already_exists", "already exists"),
        (
            [command("spawn", "r0"), command("terminate", "rt"), command("pause", "r1")],
            "already_terminated",
            "terminated",
        ),
        ([command("spawn", "r0"), command("resume", "r1")], "invalid_transition", "active"),
        (
            [command("spawn", "r0"), command("pause", "rp"), command("pause", "r1")],
            "invalid_transition",
            "paused",
        ),
        (
            [
                command("spawn", "r0"),
                command("pause", "rp"),
                command("resume", "r1", checkpoint_id="nope"),
            ],
            "checkpoint_not_found",
            "nope",
        ),
        ([command("spawn", "r1", schema_version=2)], "unsupported_version", "schema_version 2"),
        ([command("spawn", "r1", seq="one")], "invalid_event", "seq"),
        ([command("spawn", "r1", initial_state={"_secret": 1})], "invalid_event", "_secret"),
        ([command("spawn", "r1", session_id="bad id!")], "invalid_event", "session_id"),
        ([command("spawn", "r1", user_id="bad user!")], "invalid_event", "user_id"),
        ([command("terminate", "r1", outcome="great")], "invalid_event", "outcome"),
        ([command("explode", "r1")], "invalid_event", "type"),
        ([command("spawn", "r0", seq=1), command("pause", "r1", seq=1)], "stale_seq", "seq 1"),
        (
            [command("spawn", "r1", initial_state={"big": "x" * 2_000_000})],
            "limit_exceeded",
            "bytes",
        ),
    ],
)
async def test_each_rejection_names_its_reason_and_an_actionable_detail(
    redis: Redis,
    settings: Settings,
    bodies: list[dict[str, Any]],
    reason: str,
    detail_mentions: str,
) -> None:
    out = await run_commands(redis, settings, bodies, expect_results=len(bodies))
    last = out[-1]
    RESULT_ADAPTER.validate_python(last)
    assert last["type"] == "command.rejected"
    assert last["causation_id"] == "r1"
    assert last["reason"] == reason
    assert detail_mentions in last["detail"]


async def test_every_result_of_a_users_session_carries_its_user_and_others_none(
    redis: Redis, settings: Settings
) -> None:
    bodies = [
        command("spawn", "u0", "s-user", user_id="alice"),
        command("pause", "u1", "s-user"),
        command("resume", "u2", "s-user", checkpoint_id="nope"),  # rejected: still hers
        command("resume", "u3", "s-user"),
        command("spawn", "u4", "s-user", user_id="bob"),  # already_exists: names its own user
        command("terminate", "u5", "s-user"),
        command("spawn", "n0", "s-nobody"),
        command("terminate", "n1", "s-nobody"),
    ]
    out = await run_commands(redis, settings, bodies, expect_results=len(bodies))
    by_cause = {r["causation_id"]: r for r in out}
    for r in out:
        RESULT_ADAPTER.validate_python(r)
    assert {c: by_cause[c].get("user_id") for c in ("u0", "u1", "u2", "u3", "u4", "u5")} == {
        "u0": "alice",
        "u1": "alice",
        "u2": "alice",
        "u3": "alice",
        "u4": "bob",
        "u5": "alice",
    }
    assert by_cause["u2"]["reason"] == "checkpoint_not_found"
    assert by_cause["u4"]["reason"] == "already_exists"
    assert by_cause["u5"]["type"] == "agent.terminated"
    # A session whose spawn named no user: not a byte more on its results.
    assert "user_id" not in by_cause["n0"] and "user_id" not in by_cause["n1"]


async def test_a_rejected_command_of_unknown_type_reports_command_null(
    redis: Redis, settings: Settings
) -> None:
    out = await run_commands(redis, settings, [command("explode", "x1")], expect_results=1)
    assert out[0]["command"] is None


async def test_initial_state_over_the_key_limit_is_rejected_without_effect(
    redis: Redis, settings: Settings
) -> None:
    limited = settings.model_copy(update={"max_keys_per_session": 5})
    state = {f"k{i}": i for i in range(6)}
    out = await run_commands(
        redis, limited, [command("spawn", "k1", initial_state=state)], expect_results=1
    )
    assert out[0]["reason"] == "limit_exceeded"
    assert "MEMWORKER_MAX_KEYS_PER_SESSION" in out[0]["detail"]
    keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", "s1")
    assert not await redis.exists(keys.meta, keys.vars)


async def test_a_spawn_with_more_variables_than_one_redis_call_takes_stores_every_one(
    redis: Redis, settings: Settings
) -> None:
    # Up to 500 variables go to Redis in one HSET straight from the script's arguments;
    # more are written in chunks.
    states = {n: {f"k{i}": {"i": i} for i in range(n)} for n in (500, 1_201)}
    spawns = [
        command("spawn", f"big{n}", session=f"big{n}", initial_state=state)
        for n, state in states.items()
    ]
    out = await run_commands(redis, settings, spawns, expect_results=2)
    assert sorted(r["initial_items"] for r in out) == [500, 1_201]
    for n, state in states.items():
        keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", f"big{n}")
        stored: Any = await redis.hgetall(keys.vars)  # type: ignore[misc]
        assert {k.decode(): orjson.loads(v) for k, v in stored.items()} == state


async def test_commands_with_seq_apply_in_seq_order_whatever_the_publish_order(
    redis: Redis, fast: Settings
) -> None:
    bodies = [
        command("terminate", "o4", seq=4),
        command("resume", "o3", seq=3),
        command("pause", "o2", seq=2),
        command("spawn", "o1", seq=1, initial_state={"a": 1}),
    ]
    out = await run_commands(redis, fast, bodies, expect_results=4)
    assert [r["causation_id"] for r in out] == ["o1", "o2", "o3", "o4"]
    assert all(r["type"] != "command.rejected" for r in out)


async def test_a_seq_gap_that_never_fills_goes_to_the_dlq_as_seq_gap(
    redis: Redis, fast: Settings
) -> None:
    bodies = [command("spawn", "g1", seq=1), command("pause", "g3", seq=3)]
    for body in bodies:
        await publish(redis, fast, body)
    streams = StreamKeys(fast.stream_prefix, 0)
    async with running_worker(fast):
        await stream_len_at_least(redis, streams.dlq, 1, timeout=15)
    letters = await dead_letters(redis, fast)
    assert letters[0]["reason"] == "seq_gap"
    assert orjson.loads(orjson.loads(letters[0]["data"])["data"])["event_id"] == "g3"
    assert [r["causation_id"] for r in await results(redis, fast)] == ["g1"]
    pending = await redis.xpending(streams.lifecycle, LIFECYCLE_GROUP)
    assert pending["pending"] == 0


async def test_junk_is_dead_lettered_or_rejected_and_good_commands_still_apply(
    redis: Redis, settings: Settings
) -> None:
    streams = StreamKeys(settings.stream_prefix, 0)
    good = [command("spawn", f"ok{i}", session=f"s{i}") for i in range(5)]
    junk: list[Any] = [
        b"\x00\xff raw bytes",
        b"[]",
        b"{}",
        b'{"event_id": "bad id with spaces"}',
        command("spawn", "wrong-types", initial_state=[1, 2], ttl_seconds="x"),
        command("spawn", "huge", blob="y" * (2 * 1024 * 1024)),
    ]
    await ensure_group(redis, streams.lifecycle, LIFECYCLE_GROUP)
    for i, body in enumerate(junk):
        await publish(
            redis,
            settings,
            good[i] if i < len(good) else command("spawn", "ok-last", session="s-last"),
        )
        await publish(redis, settings, body, shard=0)
    await redis.xadd(streams.lifecycle, {"not-data": "x"})
    async with running_worker(settings):
        await stream_len_at_least(redis, streams.results, 8)
        await stream_len_at_least(redis, streams.dlq, 5)
    out = await results(redis, settings)
    applied = sorted(r["causation_id"] for r in out if r["type"] == "agent.spawned")
    assert applied == ["ok-last", "ok0", "ok1", "ok2", "ok3", "ok4"]
    rejected = {r["causation_id"]: r for r in out if r["type"] == "command.rejected"}
    assert rejected["wrong-types"]["reason"] == "invalid_event"
    assert "initial_state" in rejected["wrong-types"]["detail"]
    assert "ttl_seconds" in rejected["wrong-types"]["detail"]
    assert rejected["huge"]["reason"] == "limit_exceeded"
    letters = await dead_letters(redis, settings)
    assert len(letters) == 5
    assert {d["reason"] for d in letters} == {"unparseable"}
    assert all(
        d["source_stream"] == streams.lifecycle and d["group"] == LIFECYCLE_GROUP for d in letters
    )
    pending = await redis.xpending(streams.lifecycle, LIFECYCLE_GROUP)
    assert pending["pending"] == 0


async def test_entries_published_before_any_worker_ran_are_processed(
    redis: Redis, settings: Settings
) -> None:
    await publish(redis, settings, command("spawn", "early"))
    streams = StreamKeys(settings.stream_prefix, 0)
    async with running_worker(settings):
        await stream_len_at_least(redis, streams.results, 1)


async def test_pending_entries_of_a_dead_consumer_are_reclaimed(
    redis: Redis, fast: Settings
) -> None:
    streams = StreamKeys(fast.stream_prefix, 0)
    await ensure_group(redis, streams.lifecycle, LIFECYCLE_GROUP)
    for i in range(10):
        await publish(redis, fast, command("spawn", f"c{i}", session=f"s{i}"))
    taken: Any = await redis.xreadgroup(LIFECYCLE_GROUP, "dead-consumer", {streams.lifecycle: ">"})
    assert len(taken[0][1]) == 10
    async with running_worker(fast):
        await stream_len_at_least(redis, streams.results, 10, timeout=15)
    pending = await redis.xpending(streams.lifecycle, LIFECYCLE_GROUP)
    assert pending["pending"] == 0
    assert len(await results(redis, fast)) == 10


async def test_a_restarted_consumer_first_processes_its_own_pending_entries(
    redis: Redis, settings: Settings
) -> None:
    streams = StreamKeys(settings.stream_prefix, 0)
    await ensure_group(redis, streams.lifecycle, LIFECYCLE_GROUP)
    await publish(redis, settings, command("spawn", "mine"))
    await redis.xreadgroup(LIFECYCLE_GROUP, "fixed-name", {streams.lifecycle: ">"})
    async with running_worker(settings, consumer="fixed-name"):
        await stream_len_at_least(redis, streams.results, 1, timeout=5)


async def test_an_entry_that_keeps_failing_goes_to_the_dlq_after_max_deliveries(
    redis: Redis, fast: Settings
) -> None:
    keys = SessionKeys.for_session(fast.stream_prefix, 1, "p1", "poisoned")
    await redis.set(keys.meta, "not a hash")  # every script touching it fails: WRONGTYPE
    # Between two good commands: all three go to Redis in one call of the apply function,
    # and the one that fails fails alone.
    await publish(redis, fast, command("spawn", "before", session="fine-before"))
    await publish(redis, fast, command("spawn", "poison", session="poisoned"))
    await publish(redis, fast, command("spawn", "after", session="fine-after"))
    streams = StreamKeys(fast.stream_prefix, 0)
    async with running_worker(fast):
        await stream_len_at_least(redis, streams.dlq, 1, timeout=15)
        await stream_len_at_least(redis, streams.results, 2)
    letters = await dead_letters(redis, fast)
    assert len(letters) == 1
    assert letters[0]["reason"] == "max_deliveries"
    assert "WRONGTYPE" in letters[0]["error"]
    assert [r["causation_id"] for r in await results(redis, fast)] == ["before", "after"]
    assert (await redis.xpending(streams.lifecycle, LIFECYCLE_GROUP))["pending"] == 0


async def test_a_paused_session_does_not_expire_and_a_resumed_one_does(
    redis: Redis, settings: Settings
) -> None:
    keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", "s1")
    await publish(redis, settings, command("spawn", "t1", ttl_seconds=60, initial_state={"a": 1}))
    await publish(redis, settings, command("pause", "t2"))
    streams = StreamKeys(settings.stream_prefix, 0)
    async with running_worker(settings):
        await stream_len_at_least(redis, streams.results, 2)
        for key in (keys.meta, keys.vars, keys.cps, keys.cpdata):
            assert await redis.pttl(key) == -1, f"{key} must not expire while paused"
        await publish(redis, settings, command("resume", "t3"))
        await stream_len_at_least(redis, streams.results, 3)
        ttl = await redis.pttl(keys.vars)
        assert 0 < ttl <= 60_000


async def test_resume_with_clear_current_false_keeps_keys_the_checkpoint_lacks(
    redis: Redis, settings: Settings
) -> None:
    keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", "s1")
    streams = StreamKeys(settings.stream_prefix, 0)
    async with running_worker(settings):
        await publish(redis, settings, command("spawn", "m1", initial_state={"a": 1, "b": 2}))
        await publish(redis, settings, command("pause", "m2", checkpoint_id="cp-1"))
        await stream_len_at_least(redis, streams.results, 2)
        await redis.hset(keys.vars, mapping={"a": b"100", "c": b"3"})  # type: ignore[misc]
        await publish(redis, settings, command("resume", "m3", clear_current=False))
        await stream_len_at_least(redis, streams.results, 3)
    stored: Any = await redis.hgetall(keys.vars)  # type: ignore[misc]
    variables = {k.decode(): orjson.loads(v) for k, v in stored.items()}
    assert variables == {"a": 1, "b": 2, "c": 3}


async def test_faststream_publisher_envelopes_are_accepted(
    redis: Redis, redis_url: str, settings: Settings
) -> None:
    streams = StreamKeys(settings.stream_prefix, 0)
    broker = RedisBroker(redis_url)
    await broker.connect()
    try:
        await broker.publish(command("spawn", "fs-1"), stream=streams.lifecycle)
    finally:
        await broker.stop()
    async with running_worker(settings):
        await stream_len_at_least(redis, streams.results, 1)
    assert (await results(redis, settings))[0]["type"] == "agent.spawned"


async def test_sessions_are_spread_over_shards_and_a_wrong_shard_is_refused(
    redis: Redis, settings: Settings
) -> None:
    sharded = settings.model_copy(update={"shards": 4})
    sessions = [f"s{i}" for i in range(40)]
    for s in sessions:
        await publish(redis, sharded, command("spawn", f"sp-{s}", session=s))
    right = shard_of("p1", "s0", 4)
    wrong = (right + 1) % 4
    await publish(redis, sharded, command("pause", "misrouted", session="s0"), shard=wrong)
    async with running_worker(sharded):

        async def all_in() -> bool:
            total = 0
            for shard in range(4):
                total += int(await redis.xlen(StreamKeys(sharded.stream_prefix, shard).results))
            return total == 41

        await wait_until(all_in)
    for shard in range(4):
        for r in await results(redis, sharded, shard):
            if r["causation_id"] == "misrouted":
                assert shard == wrong
                assert r["reason"] == "invalid_event"
                assert f"belongs to shard {right}" in r["detail"]
            else:
                assert shard_of("p1", r["session_id"], 4) == shard
                assert r["type"] == "agent.spawned"
    used = {shard_of("p1", s, 4) for s in sessions}
    assert len(used) == 4


async def test_projects_never_share_a_session_or_a_dedupe_record(
    redis: Redis, settings: Settings
) -> None:
    out = await run_commands(
        redis,
        settings,
        [
            command("spawn", "same-id", project="alpha", initial_state={"who": "alpha"}),
            command("spawn", "same-id", project="beta", initial_state={"who": "beta"}),
        ],
        expect_results=2,
    )
    assert sorted(r["project_id"] for r in out) == ["alpha", "beta"]
    assert all(r["type"] == "agent.spawned" for r in out)
    assert out[0]["event_id"] != out[1]["event_id"]
    for project in ("alpha", "beta"):
        keys = SessionKeys.for_session(settings.stream_prefix, 1, project, "s1")
        assert orjson.loads(await redis.hget(keys.vars, "who") or b"null") == project  # type: ignore[misc]


async def test_redis_going_away_makes_the_worker_not_ready_until_it_returns(
    tmp_path: Any, prefix: str
) -> None:
    from tests.redis_process import RedisProcess

    server = RedisProcess(tmp_path)
    server.start()
    try:
        settings = Settings(
            redis_url=server.url, stream_prefix=prefix, reclaim_idle_ms=300, reclaim_interval_ms=100
        )
        client = Redis.from_url(server.url)
        streams = StreamKeys(prefix, 0)
        await publish(client, settings, command("spawn", "before"))
        async with running_worker(settings) as worker:
            await stream_len_at_least(client, streams.results, 1)
            server.stop()

            async def not_ready() -> bool:
                return not worker.ready

            await wait_until(not_ready, timeout=20)
            server.start()
            await client.aclose()
            client = Redis.from_url(server.url)
            await publish(client, settings, command("spawn", "after", session="s2"))
            await stream_len_at_least(client, streams.results, 2, timeout=30)
            assert worker.ready
        await client.aclose()
    finally:
        server.stop()


async def test_a_redis_restarted_without_its_data_gets_groups_back_and_work_resumes(
    tmp_path: Any, prefix: str
) -> None:
    from tests.redis_process import RedisProcess

    server = RedisProcess(tmp_path, persistent=False)
    server.start()
    try:
        settings = Settings(
            redis_url=server.url, stream_prefix=prefix, reclaim_idle_ms=300, reclaim_interval_ms=100
        )
        streams = StreamKeys(prefix, 0)
        async with running_worker(settings) as worker:
            client = Redis.from_url(server.url)
            await publish(client, settings, command("spawn", "before"))
            await stream_len_at_least(client, streams.results, 1)
            await client.aclose()
            server.stop()
            server.start()  # empty: no stream, no group, no scripts

            async def ready_again() -> bool:
                return worker.ready

            client = Redis.from_url(server.url)

            async def group_back() -> bool:
                try:
                    return bool(await client.xinfo_groups(streams.lifecycle))
                except Exception:
                    return False

            await wait_until(group_back, timeout=30)
            await publish(client, settings, command("spawn", "after", session="s2"))
            await stream_len_at_least(client, streams.results, 1, timeout=30)
            await wait_until(ready_again)
            assert (await results(client, settings))[0]["causation_id"] == "after"
            await client.aclose()
    finally:
        server.stop()


async def test_a_rejected_command_at_its_seq_does_not_hold_up_the_next_one(
    redis: Redis, fast: Settings
) -> None:
    out = await run_commands(
        redis,
        fast,
        [
            command("spawn", "q1", seq=1),
            command("spawn", "q2", seq=2),  # rejected already_exists, but seq 2 is used up
            command("resume", "q3", seq=3),  # rejected invalid_transition (active)
            command("pause", "q4", seq=4),
        ],
        expect_results=4,
    )
    assert [(r["causation_id"], r.get("reason")) for r in out] == [
        ("q1", None),
        ("q2", "already_exists"),
        ("q3", "invalid_transition"),
        ("q4", None),
    ]


async def test_a_server_that_lost_the_apply_function_gets_it_back_and_applies_nothing_twice(
    tmp_path: Any, prefix: str
) -> None:
    """The apply function lives in the server (FUNCTION LOAD): a server that forgot it (here
    FUNCTION FLUSH, as a restart without persistence does) answers ``Function not found``; the
    worker loads it again and redoes the batch, with no command lost, doubled or dead-lettered."""
    from tests.redis_process import RedisProcess
    from worker.lifecycle.apply import APPLY

    server = RedisProcess(tmp_path, persistent=False)
    server.start()
    try:
        settings = Settings(redis_url=server.url, stream_prefix=prefix)
        client = Redis.from_url(server.url)
        streams = StreamKeys(prefix, 0)

        async def libraries() -> list[str]:
            listed: Any = await client.function_list()  # type: ignore[misc]  # each library: a flat name/value list
            return [
                dict(zip(row[::2], row[1::2], strict=True))[b"library_name"].decode()
                for row in listed
            ]

        async with running_worker(settings):
            for n in range(50):
                await publish(client, settings, command("spawn", f"spawn-{n}", session=f"s{n}"))
            await stream_len_at_least(client, streams.results, 50)
            assert await libraries() == [APPLY.library]
            await client.function_flush()  # type: ignore[misc]
            for n in range(50):
                await publish(client, settings, command("pause", f"pause-{n}", session=f"s{n}"))
            # and a redelivered spawn: still a duplicate, not a second session
            await publish(client, settings, command("spawn", "spawn-7", session="s7"))
            await stream_len_at_least(client, streams.results, 100)

            async def all_done() -> bool:  # every command read and acknowledged
                groups: Any = await client.xinfo_groups(streams.lifecycle)
                return bool(groups[0]["pending"] == 0 and groups[0]["lag"] == 0)

            await wait_until(all_done)
            assert await libraries() == [APPLY.library]
        rows = await results(client, settings)
        assert sorted(r["type"] for r in rows) == ["agent.paused"] * 50 + ["agent.spawned"] * 50
        assert len({r["event_id"] for r in rows}) == 100
        assert await dead_letters(client, settings) == []
        await client.aclose()
    finally:
        server.stop()


async def test_a_command_ahead_for_a_session_never_spawned_is_answered_within_the_spawn_wait(
    redis: Redis, settings: Settings
) -> None:
    # Nothing will ever fill the gap: no spawn of p1/ghost is in the stream. Answered once the
    # spawn wait (0.5 s here) is over, not dead-lettered seq_gap after
    # MEMWORKER_SEQ_GAP_TIMEOUT_SECONDS (60 s here).
    out = await run_commands(
        redis,
        settings.model_copy(update={"spawn_wait_seconds": 0.5, "seq_retry_ms": 20}),
        [command("pause", "gh2", session="ghost", seq=2), command("terminate", "gh3", seq=3)],
        expect_results=2,
    )
    assert [(r["type"], r["reason"]) for r in out] == [("command.rejected", "unknown_session")] * 2
    assert "spawn it first" in out[0]["detail"]
    assert await dead_letters(redis, settings) == []


async def test_a_pause_after_a_rejected_spawn_is_answered_unknown_session_through_the_client(
    redis: Redis, settings: Settings
) -> None:
    from worker.client import LifecycleClient

    client = LifecycleClient(redis, settings)
    async with running_worker(settings):
        bad = await client.spawn("p1", "bad", "agent-1", {"k": 1}, ttl_seconds=-5)
        spawned = await client.wait(bad, 10)
        assert spawned.type == "command.rejected" and spawned.reason == "invalid_event"
        paused = await client.wait(await client.pause("p1", "bad", "agent-1"), 10)
    assert paused.type == "command.rejected" and paused.reason == "unknown_session"


async def test_a_command_ahead_still_waits_for_a_spawn_another_consumer_holds(
    redis: Redis, fast: Settings
) -> None:
    # The spawn was read by a consumer that died before applying it: the pause (seq 2) waits
    # for it, as a command ahead always did, and both apply once the spawn is reclaimed.
    streams = StreamKeys(fast.stream_prefix, 0)
    await ensure_group(redis, streams.lifecycle, LIFECYCLE_GROUP)
    await publish(redis, fast, command("spawn", "w1", session="late", seq=1))
    await redis.xreadgroup(LIFECYCLE_GROUP, "died", {streams.lifecycle: ">"}, count=1)
    await publish(redis, fast, command("pause", "w2", session="late", seq=2))
    async with running_worker(fast):
        await stream_len_at_least(redis, streams.results, 2)
    out = await results(redis, fast)
    assert [(r["causation_id"], r["type"]) for r in out] == [
        ("w1", "agent.spawned"),
        ("w2", "agent.paused"),
    ]


async def test_a_second_spawn_of_a_live_session_leaves_it_whole_through_the_client(
    redis: Redis, settings: Settings
) -> None:
    # The client's seq counter goes on at a spawn: the second spawn is rejected at the seq it
    # took, and the session's next command, at the next seq, applies.
    from worker.client import LifecycleClient

    client = LifecycleClient(redis, settings)
    async with running_worker(settings):
        for step in (
            client.spawn("p1", "twice", "agent-1", {"k": 1}),
            client.pause("p1", "twice", "agent-1"),
            client.resume("p1", "twice", "agent-1"),
        ):
            assert (await client.wait(await step, 10)).type != "command.rejected"
        again = await client.wait(await client.spawn("p1", "twice", "agent-1", {"k": 2}), 10)
        ended = await client.wait(await client.terminate("p1", "twice", "agent-1"), 10)
    assert again.type == "command.rejected" and again.reason == "already_exists"
    assert ended.type == "agent.terminated"
    assert ended.snapshot is not None and ended.snapshot.variables == {"k": 1}


async def test_a_republished_command_takes_no_seq_from_the_session(
    redis: Redis, settings: Settings
) -> None:
    # A publish retried with the same event_id (it took a seq of its own) is a duplicate; the
    # session's next command is applied, not held for the seq the retry took.
    from worker.client import LifecycleClient

    client = LifecycleClient(redis, settings)
    async with running_worker(settings):
        await client.wait(await client.spawn("p1", "retry", "agent-1", {"k": 1}), 10)
        body = {
            "type": "pause",
            "project_id": "p1",
            "session_id": "retry",
            "agent_instance_id": "agent-1",
            "event_id": "pz-1",
        }
        first = await client.wait(await client.publish(dict(body)), 10)
        again = await client.wait(await client.publish(dict(body)), 10)
        resumed = await client.wait(await client.resume("p1", "retry", "agent-1"), 10)
    assert first.type == "agent.paused"
    assert again.event_id == first.event_id  # the same result, found at once
    assert resumed.type == "agent.resumed"


async def test_a_command_for_an_earlier_life_never_touches_a_session_id_spawned_again(
    redis: Redis, settings: Settings
) -> None:
    # A terminate of the first life, replayed once its tombstone expired and the id was
    # spawned again, carries seq 2: the new life's next seq. Its spawn_event_id (stamped by
    # the client) names the first spawn: rejected stale_session, the new session untouched.
    from worker.client import LifecycleClient
    from worker.memory import WorkingMemory

    short = settings.model_copy(update={"tombstone_ttl_seconds": 1, "dedupe_ttl_seconds": 1})
    client = LifecycleClient(redis, short)
    lifecycle = StreamKeys(short.stream_prefix, 0).lifecycle
    async with running_worker(short):
        first = await client.spawn("p1", "reused", "agent-1", {"life": 1})
        await client.wait(first, 10)
        ended = await client.wait(await client.terminate("p1", "reused", "agent-1"), 10)
        assert ended.type == "agent.terminated"
        rows: Any = await redis.xrange(lifecycle)
        old_terminate = rows[-1][1][b"data"]
        assert orjson.loads(old_terminate)["spawn_event_id"] == first
        keys = SessionKeys.for_session(short.stream_prefix, 1, "p1", "reused")

        async def forgotten() -> bool:
            return not await redis.exists(keys.meta)

        await wait_until(forgotten, timeout=10)  # the tombstone expired: the id is free
        await client.wait(await client.spawn("p1", "reused", "agent-1", {"life": 2}), 10)

        await redis.xadd(lifecycle, {"data": old_terminate})  # the first life's terminate
        await stream_len_at_least(redis, StreamKeys(short.stream_prefix, 0).results, 4)
    replayed = (await results(redis, short))[-1]
    assert (replayed["type"], replayed["reason"]) == ("command.rejected", "stale_session")
    memory = await WorkingMemory.for_session("reused", "p1", "agent-1", redis=redis, settings=short)
    assert await memory.get("life") == 2
    assert (await memory.get_stats())["state"] == "active"
