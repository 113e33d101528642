"""The long-term memory API: listing, search, history, forget and export, scoped by project."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.helpers import running_worker
from tests.integration.results_factory import (
    T0,
    base_result,
    migrated_engine,
    publish,
    session_story,
    terminated,
)
from worker.agents.manager import AgentLifecycleManager
from worker.consolidation.consolidator import Consolidator
from worker.db.models import episode_id_for
from worker.episodes.store import EpisodeStore
from worker.erasure.forget import ForgetResult
from worker.keys import SessionKeys
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings

SESSIONS = 1_200  # per project: 8,400 working-memory keys each, well past any page size


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(database_url) as engine:
        yield engine


async def consolidate(settings: Settings, redis: Redis, engine: AsyncEngine) -> None:
    await Consolidator(settings, redis, engine, batch_size=2_000).run_once()


async def fill_working_memory(
    redis: Redis, prefix: str, project_id: str, sessions: list[str], shards: int = 4
) -> None:
    pipe = redis.pipeline(transaction=False)
    for n, session_id in enumerate(sessions):
        keys = SessionKeys.for_session(prefix, shards, project_id, session_id)
        pipe.hset(keys.meta, mapping={"state": "active", "project_id": project_id})
        pipe.hset(keys.vars, mapping={"goal": orjson.dumps({"n": n}), "note": b'"hi"'})
        pipe.zadd(keys.vexp, {"note": 10**13})
        pipe.set(keys.task, orjson.dumps({"status": "in_progress", "current_step": n}))
        pipe.rpush(keys.scratch, orjson.dumps({"content": "step", "timestamp": "t"}))
        pipe.zadd(keys.cps, {"cp-1": 1})
        pipe.hset(keys.cpdata, mapping={"cp-1|info": b"{}", "cp-1|vars": b"\x00\xff binary"})
        if n % 500 == 499:
            await pipe.execute()
    await pipe.execute()


async def redis_snapshot(redis: Redis, pattern: str) -> dict[bytes, bytes | None]:
    """Every key matching ``pattern`` with its DUMP: equal snapshots mean untouched keys."""
    out: dict[bytes, bytes | None] = {}
    async for key in redis.scan_iter(match=pattern, count=1_000):
        out[key] = await redis.dump(key)
    return out


async def rows_of(store: EpisodeStore, project_id: str) -> dict[str, Any]:
    export = await store.export(project_id)
    return {"episodes": export.episodes, "events": export.lifecycle_events}


async def test_forget_one_project_leaves_other_projects_rows_and_keys_untouched(
    redis: Redis, prefix: str, redis_url: str, engine: AsyncEngine
) -> None:
    # A prefix with a glob character, and a sibling prefix it would match unescaped.
    wm_prefix, sibling_prefix = f"{prefix}:w*", f"{prefix}:wX"
    settings = Settings(redis_url=redis_url, stream_prefix=prefix, shards=4)
    projects = ["proj-a", "proj-ab", "proj-b"]  # proj-ab: same leading characters
    sessions = [f"s-{i}" for i in range(SESSIONS)]
    for project in projects:
        await publish(
            redis,
            settings,
            [r for i, s in enumerate(sessions) for r in session_story(project, s, i)[::4]],
        )
        await fill_working_memory(redis, wm_prefix, project, sessions)
    await fill_working_memory(redis, sibling_prefix, "proj-a", sessions[:50])
    await consolidate(settings, redis, engine)
    store = EpisodeStore(engine)
    others_before = {p: await rows_of(store, p) for p in projects[1:]}
    keys_before = await redis_snapshot(redis, f"{prefix}:*")
    assert len(keys_before) > 3 * 7 * SESSIONS

    result = await store.forget("proj-a", redis=redis, prefix=wm_prefix)

    assert result == ForgetResult(
        episodes=SESSIONS, lifecycle_events=2 * SESSIONS, redis_keys=7 * SESSIONS
    )
    assert await rows_of(store, "proj-a") == {"episodes": [], "events": []}
    for project in projects[1:]:
        assert await rows_of(store, project) == others_before[project]
    keys_after = await redis_snapshot(redis, f"{prefix}:*")
    removed = {k for k in keys_before if k not in keys_after}
    added = {k for k in keys_after if k not in keys_before}
    changed = {k for k in keys_after if k in keys_before and keys_before[k] != keys_after[k]}
    # The erasure record and the memory.forgotten event (ids, times, counts)
    assert added == {f"{wm_prefix}:erased".encode(), f"{wm_prefix}:episodes".encode()}
    assert len(removed) == 6 * SESSIONS  # all but meta, which is now the session's marker
    assert len(changed) == SESSIONS
    for key in removed | changed:
        assert key.decode().startswith(f"{wm_prefix}:{{"), key
        assert b":s:proj-a/" in key, key
    for key in changed:
        assert key.endswith(b":meta")
        marker = await redis.hgetall(key)  # type: ignore[misc, arg-type]
        assert set(marker) == {b"state", b"forgotten_at"}  # ids in the name, a time: no content
        assert marker[b"state"] == b"forgotten"
    assert await store.forget("proj-a", redis=redis, prefix=wm_prefix) == ForgetResult()


async def test_forget_one_session_leaves_the_projects_other_sessions(
    redis: Redis, prefix: str, redis_url: str, engine: AsyncEngine
) -> None:
    settings = Settings(redis_url=redis_url, stream_prefix=prefix)
    sessions = ["s1", "s1:x", "s10", "s2"]  # ids may contain ':'; "s1" must not reach "s1:x"
    await publish(redis, settings, [r for s in sessions for r in session_story("proj-a", s)])
    await fill_working_memory(redis, prefix, "proj-a", sessions)
    await consolidate(settings, redis, engine)
    store = EpisodeStore(engine)

    result = await store.forget("proj-a", session_id="s1", redis=redis, prefix=prefix)

    assert result == ForgetResult(episodes=1, lifecycle_events=5, redis_keys=7)
    left = await store.export("proj-a", redis=redis, prefix=prefix)
    assert sorted(left.working_memory) == sorted(["s1:x", "s10", "s2"])
    assert sorted({e["session_id"] for e in left.episodes}) == sorted(["s1:x", "s10", "s2"])
    assert len(left.lifecycle_events) == 15


async def test_forget_before_removes_only_older_history_and_keeps_working_memory(
    redis: Redis, prefix: str, redis_url: str, engine: AsyncEngine
) -> None:
    settings = Settings(redis_url=redis_url, stream_prefix=prefix)
    await publish(redis, settings, [terminated("proj-a", f"s-{i}", i * 60) for i in range(10)])
    await fill_working_memory(redis, prefix, "proj-a", ["live"])
    await consolidate(settings, redis, engine)
    store = EpisodeStore(engine)
    cutoff = datetime(2025, 1, 1, 0, 5, tzinfo=UTC)  # episodes 0..4 occurred before it

    result = await store.forget("proj-a", before=cutoff, redis=redis, prefix=prefix)

    assert result == ForgetResult(episodes=5, lifecycle_events=5, redis_keys=0)
    remaining = await store.list_episodes("proj-a")
    assert sorted(e.session_id for e in remaining) == [f"s-{i}" for i in range(5, 10)]
    assert len((await store.export("proj-a", redis=redis, prefix=prefix)).working_memory) == 1


async def test_search_ranks_the_matching_episode_first(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    results = [
        terminated(
            "proj-a",
            "s-kafka",
            1,
            task_description="Migrate the Kafka consumer to Redis Streams",
            lessons=["consumer groups need explicit acknowledgement"],
        ),
        terminated(
            "proj-a",
            "s-mention",
            2,
            task_description="Write the weekly report",
            lessons=["mention streams once"],
        ),
        *[terminated("proj-a", f"s-{i}", i + 3) for i in range(30)],
        terminated(
            "proj-b",
            "s-other",
            3,
            task_description="Migrate the Kafka consumer to Redis Streams, twice",
        ),
    ]
    await publish(redis, settings, results)
    await consolidate(settings, redis, engine)
    store = EpisodeStore(engine)

    hits = await store.search("proj-a", "kafka consumer streams")
    assert [hit.episode.session_id for hit in hits] == ["s-kafka"]
    broad = await store.search("proj-a", "streams")
    assert [hit.episode.session_id for hit in broad][:2] == ["s-kafka", "s-mention"]
    assert broad[0].rank > broad[1].rank
    assert await store.search("proj-a", "nothing-like-this") == []
    assert [h.episode.project_id for h in await store.search("proj-b", "kafka")] == ["proj-b"]


async def test_list_episodes_filters_and_pages_past_a_hundred(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    results = [
        terminated(
            "proj-a",
            f"s-{i}",
            i,
            outcome="failure" if i % 5 == 0 else "success",
            agent_type_id="coder" if i % 2 else "researcher",
        )
        for i in range(250)
    ]
    results.append(terminated("proj-b", "s-0", 0))
    await publish(redis, settings, results)
    await consolidate(settings, redis, engine)
    store = EpisodeStore(engine)

    pages = [await store.list_episodes("proj-a", limit=100, offset=o) for o in (0, 100, 200, 300)]
    assert [len(p) for p in pages] == [100, 100, 50, 0]
    seen = [e.session_id for page in pages for e in page]
    assert seen == [f"s-{i}" for i in reversed(range(250))]  # newest first, no overlaps
    assert len(await store.list_episodes("proj-a", outcome="failure", limit=1000)) == 50
    coders = await store.list_episodes("proj-a", agent_type_id="coder", limit=1000)
    assert len(coders) == 125
    window = await store.list_episodes(
        "proj-a",
        since=datetime(2025, 1, 1, 0, 1, tzinfo=UTC),
        until=datetime(2025, 1, 1, 0, 2, tzinfo=UTC),
        limit=1000,
    )
    assert sorted(e.session_id for e in window) == sorted(f"s-{i}" for i in range(60, 120))
    assert [e.session_id for e in await store.list_episodes("proj-a", session_id="s-7")] == ["s-7"]
    assert await store.list_episodes("proj-c") == []


async def test_get_episode_never_crosses_projects(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    result = terminated("proj-a", "s-1", 0)
    await publish(redis, settings, [result])
    await consolidate(settings, redis, engine)
    store = EpisodeStore(engine)
    episode_id = episode_id_for(result["event_id"])

    found = await store.get_episode("proj-a", str(episode_id))
    assert found is not None
    assert found.source_event_id == result["event_id"]
    assert await store.get_episode("proj-b", episode_id) is None
    assert await store.get_episode("proj-a", "not-a-uuid") is None


async def test_session_history_lists_the_sessions_results_in_order(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    story = session_story("proj-a", "s-1", 100)
    await publish(redis, settings, [*reversed(story), *session_story("proj-a", "s-2")])
    await publish(redis, settings, [base_result("agent.spawned", "proj-b", "s-1", initial_items=0)])
    await consolidate(settings, redis, engine)

    history = await EpisodeStore(engine).session_history("proj-a", "s-1")

    assert [e.event_id for e in history] == [r["event_id"] for r in story]
    assert history[0].occurred_at > T0


async def test_export_returns_every_row_and_the_working_memory(
    redis: Redis, prefix: str, redis_url: str, engine: AsyncEngine
) -> None:
    settings = Settings(redis_url=redis_url, stream_prefix=prefix)
    sessions = [f"s-{i}" for i in range(SESSIONS)]
    await publish(redis, settings, [terminated("proj-a", s, i) for i, s in enumerate(sessions)])
    await publish(redis, settings, [terminated("proj-b", "s-0", 0)])
    await fill_working_memory(redis, prefix, "proj-a", sessions)
    await fill_working_memory(redis, prefix, "proj-b", ["s-0"])
    await consolidate(settings, redis, engine)

    export = await EpisodeStore(engine).export("proj-a", redis=redis, prefix=prefix)

    assert len(export.episodes) == SESSIONS
    assert len(export.lifecycle_events) == SESSIONS
    assert {e["project_id"] for e in export.episodes} == {"proj-a"}
    assert sorted(export.working_memory) == sorted(sessions)
    memory = export.working_memory["s-7"]
    assert sorted(memory) == ["cpdata", "cps", "meta", "scratch", "task", "vars", "vexp"]
    assert orjson.loads(memory["vars"]["goal"]) == {"n": 7}
    assert memory["cpdata"]["cp-1|vars"] == {"base64": "AP8gYmluYXJ5"}
    orjson.dumps(export.to_dict())  # JSON-ready as a whole
    one = await EpisodeStore(engine).export("proj-a", session_id="s-7", redis=redis, prefix=prefix)
    assert (len(one.episodes), len(one.lifecycle_events), list(one.working_memory)) == (
        1,
        1,
        ["s-7"],
    )


async def test_a_spawns_user_owns_its_episode_and_recall_filters_by_user(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    async with running_worker(settings):
        manager = AgentLifecycleManager(LifecycleClient(redis, settings), timeout=20)
        client = manager.client
        spawned = await manager.spawn("proj-u", "agent-1", "s-alice", user_id="alice")
        assert spawned.success, spawned.message
        await client.spawn("proj-u", "s-bob", "agent-1", user_id="bob")
        await client.spawn("proj-u", "s-nobody", "agent-1")
        task = "Migrate the Kafka consumer to Redis Streams"
        for session_id in ("s-alice", "s-bob", "s-nobody"):
            await client.wait(
                await client.terminate(
                    "proj-u", session_id, "agent-1", task_description=f"{task} ({session_id})"
                ),
                timeout=20,
            )
    await consolidate(settings, redis, engine)
    store = EpisodeStore(engine)

    hers = await store.recall("proj-u", "kafka consumer", user_id="alice", mode="text")
    assert [(h.episode.session_id, h.episode.user_id) for h in hers] == [("s-alice", "alice")]
    assert hers[0].to_dict()["user_id"] == "alice"
    assert await store.recall("proj-u", "kafka consumer", user_id="carol", mode="text") == []
    everyone = await store.recall("proj-u", "kafka consumer", mode="text")
    assert {h.episode.session_id for h in everyone} == {"s-alice", "s-bob", "s-nobody"}
    assert [e.session_id for e in await store.list_episodes("proj-u", user_id="bob")] == ["s-bob"]
    found = await store.search("proj-u", "kafka", user_id="bob")
    assert [h.episode.session_id for h in found] == ["s-bob"]
    nobody = await store.list_episodes("proj-u", session_id="s-nobody")
    assert nobody[0].user_id is None and nobody[0].to_dict()["user_id"] is None
