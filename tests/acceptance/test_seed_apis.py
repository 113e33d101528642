"""Code written against the syndarix / LoomFlow APIs runs unchanged on memworker.

The calls below are shaped the way the seeds' callers make them: positional ids given as
``uuid.UUID``, settings from the environment, ``ttl_seconds=``, ``progress_percent=``,
``checkpoint["id"]``, ``stats["user_keys"]``, ``except MemoryNotFoundError``, the lifecycle
manager's four calls and their ``data``. Real Redis, a real ``memworker run`` subprocess, and
the consolidator writing to a real Postgres.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from enum import Enum

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from tests.helpers import dead_letters, wait_until, worker_process
from worker import AgentLifecycleManager, LifecycleEvent, LifecycleHooks, LifecycleResult
from worker.consolidation.consolidator import Consolidator
from worker.db.migrate import migrate
from worker.db.models import Episode
from worker.keys import StreamKeys
from worker.lifecycle.client import LifecycleClient, ResultTimeoutError
from worker.memory import MemoryNotFoundError, SessionPausedError, TaskState, WorkingMemory
from worker.settings import Settings, get_settings

pytestmark = pytest.mark.slow


class Outcome(Enum):
    """The seed's outcome enum, as its callers pass it."""

    SUCCESS = "success"
    FAILURE = "failure"


@pytest.fixture
def seed_env(
    settings: Settings, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    """The environment a seed's process would have: the servers and prefix, nothing passed."""
    monkeypatch.setenv("REDIS_URL", settings.redis_url)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("MEMWORKER_STREAM_PREFIX", settings.stream_prefix)
    get_settings.cache_clear()
    try:
        yield get_settings()
    finally:
        get_settings.cache_clear()


async def test_working_memory_calls_written_for_the_seed_run_unchanged(
    seed_env: Settings, redis: Redis
) -> None:
    session_id, project_id, agent_instance_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    memory = await WorkingMemory.for_session(session_id, project_id, agent_instance_id)
    try:
        await memory.set("plan", {"steps": 3}, ttl_seconds=600)
        await memory.set("scratch", "short-lived", ttl_seconds=1)
        assert await memory.get("plan") == {"steps": 3}

        task = await memory.update_task_progress(current_step=1, progress_percent=33)
        assert task.progress_percent == 33  # no set_task_state before: it was created
        await memory.set_task_state(TaskState(description="write report", progress_percent=40))
        state = await memory.get_task_state()
        assert state is not None
        assert state.progress_percent == 40
        assert (await memory.update_task_progress(progress_percent=80)).progress_percent == 80

        await memory.append_scratchpad("looked up the docs")
        [entry] = await memory.get_scratchpad_with_timestamps()
        assert entry["content"] == "looked up the docs"
        assert entry["timestamp"]

        first = await memory.create_checkpoint("before the risky part")
        second = await memory.create_checkpoint("after it")
        checkpoints = await memory.list_checkpoints()
        assert [c["id"] for c in checkpoints] == [first, second]
        assert [c["description"] for c in checkpoints] == ["before the risky part", "after it"]
        assert all(c["created_at"] for c in checkpoints)

        stats = await memory.get_stats()
        assert stats["user_keys"] == 2
        assert stats["checkpoint_count"] == 2
        assert stats["has_task_state"] is True
        assert stats["scope_type"] == "session"
        assert stats["scope_id"] == str(session_id)
        assert stats["using_fallback"] is False

        try:
            await memory.restore_checkpoint("no-such-checkpoint")
            caught = ""
        except MemoryNotFoundError as exc:  # as the seeds' callers catch it
            caught = str(exc)
        assert "no-such-checkpoint" in caught
    finally:
        await memory.close()


async def test_the_lifecycle_managers_four_calls_return_the_seeds_results(
    seed_env: Settings, redis: Redis
) -> None:
    project_id, agent_instance_id, session_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    agent_type_id = uuid.uuid4()
    await migrate(seed_env.database_url)
    manager = AgentLifecycleManager()
    with worker_process(seed_env):
        spawned = await manager.spawn(
            project_id,
            agent_instance_id,
            session_id,
            agent_type_id,
            initial_state={"goal": "reconcile invoices", "budget": 3},
            metadata={"orchestrator": "seed"},
        )
        assert isinstance(spawned, LifecycleResult)
        assert (spawned.success, spawned.event_type) == (True, "spawn")
        assert spawned.data == {"initial_items": 2}
        assert spawned.duration_ms > 0

        memory = await WorkingMemory.for_session(session_id, project_id, agent_instance_id)
        assert await memory.get("goal") == "reconcile invoices"
        await memory.append_scratchpad("found 3 invoices")

        paused = await manager.pause(project_id, agent_instance_id, session_id)
        assert (paused.success, paused.event_type) == (True, "pause")
        assert set(paused.data) == {"checkpoint_id", "items_saved", "timestamp"}
        assert paused.data["items_saved"] == 3
        listed = await manager.list_checkpoints(project_id, agent_instance_id, session_id)
        assert [c["id"] for c in listed] == [paused.data["checkpoint_id"]]

        with pytest.raises(SessionPausedError, match="is paused"):  # resume would undo it
            await memory.set("budget", 99)
        resumed = await manager.resume(
            project_id, agent_instance_id, session_id, paused.data["checkpoint_id"]
        )
        assert resumed.success
        assert resumed.data == {
            "checkpoint_id": paused.data["checkpoint_id"],
            "items_restored": 3,
        }
        assert await memory.get("budget") == 3

        terminated = await manager.terminate(
            project_id,
            agent_instance_id,
            session_id,
            task_description="reconcile the invoices",
            outcome=Outcome.SUCCESS,  # the seeds pass their enum
            lessons_learned=["ask for the currency first"],
        )
        assert (terminated.success, terminated.event_type) == (True, "terminate")
        assert set(terminated.data) == {"episode_id", "items_cleared", "outcome"}
        assert (terminated.data["items_cleared"], terminated.data["outcome"]) == (3, "success")
        await memory.close()

        other = uuid.uuid4()
        await manager.spawn(project_id, agent_instance_id, other)
        rejected = await manager.resume(project_id, agent_instance_id, other)  # not paused
        assert (rejected.success, rejected.event_type, rejected.reason) == (
            False,
            "resume",
            "invalid_transition",
        )
        assert rejected.data == {"reason": "invalid_transition"}
        assert "resume applies only to a paused session" in rejected.message
        assert rejected.result is not None
        assert rejected.message == getattr(rejected.result, "detail", None)

        unconsolidated = await manager.terminate(
            project_id, agent_instance_id, other, consolidate_to_episodic=False
        )
        assert unconsolidated.success
        assert unconsolidated.data["episode_id"] is None
    await manager.close()

    # The episode is written by the consolidator, after terminate returned, under that id.
    consolidator = Consolidator.from_settings(seed_env)
    try:
        await consolidator.run_once()
    finally:
        await consolidator.close()
    engine = create_async_engine(seed_env.database_url)
    try:
        async with engine.connect() as conn:
            rows = (
                await conn.execute(select(Episode.id, Episode.session_id, Episode.outcome))
            ).all()
    finally:
        await engine.dispose()
    assert [(str(i), s, o) for i, s, o in rows] == [
        (terminated.data["episode_id"], str(session_id), "success")
    ]


async def test_a_lifecycle_call_with_no_worker_running_times_out_saying_so(
    seed_env: Settings, redis: Redis
) -> None:
    async with AgentLifecycleManager(timeout=0.5) as manager:
        with pytest.raises(ResultTimeoutError, match=r"no result arrived within 0\.5s") as raised:
            await manager.spawn("p", "agent-1", "s-nobody-home")
    assert "memworker run" in str(raised.value)


async def group_exists(redis: Redis, settings: Settings, group: str) -> bool:
    stream = StreamKeys(settings.stream_prefix, 0).results
    try:
        groups = await redis.xinfo_groups(stream)
    except Exception:  # no stream yet
        return False
    return any(g["name"] in (group, group.encode()) for g in groups)


async def test_hooks_run_for_every_command_retry_a_failing_hook_and_dead_letter_a_broken_one(
    seed_env: Settings, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMWORKER_MAX_DELIVERIES", "3")
    monkeypatch.setenv("MEMWORKER_HOOK_RETRY_SECONDS", "0")  # MAX_DELIVERIES tries, then the DLQ
    get_settings.cache_clear()
    hooks = LifecycleHooks()
    spawned: list[LifecycleEvent] = []
    pause_attempts: list[LifecycleEvent] = []
    paused: list[LifecycleEvent] = []

    @hooks.on_spawn
    async def record_spawn(event: LifecycleEvent) -> None:
        spawned.append(event)

    @hooks.on_pause
    async def fails_once(event: LifecycleEvent) -> None:
        pause_attempts.append(event)
        if len(pause_attempts) == 1:
            raise RuntimeError("first try fails")
        paused.append(event)

    @hooks.on_terminate
    def always_broken(event: LifecycleEvent) -> None:
        raise RuntimeError("the terminate hook is broken")

    stop, listening = asyncio.Event(), asyncio.Event()
    serving = asyncio.create_task(hooks.serve("seed-hooks", stop=stop, ready=listening))
    await listening.wait()
    assert await group_exists(redis, seed_env, "seed-hooks")
    project_id, agent_instance_id, session_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with worker_process(seed_env):
        async with AgentLifecycleManager() as manager:
            await manager.spawn(
                project_id, agent_instance_id, session_id, "researcher", metadata={"run": 1}
            )
            await manager.pause(project_id, agent_instance_id, session_id, "cp-1")
            await manager.terminate(project_id, agent_instance_id, session_id)
        async with LifecycleClient() as other_publisher:  # not the manager: hooks run too
            sent = await other_publisher.spawn("elsewhere", "s-other", "agent-9", {"x": 1})
            await other_publisher.wait(sent)

        async def all_handled() -> bool:
            letters = [d for d in await dead_letters(redis, seed_env) if d["group"] == "seed-hooks"]
            return len(spawned) >= 2 and len(paused) >= 1 and len(letters) >= 1

        await wait_until(all_handled)
    stop.set()
    await serving

    assert [(e.project_id, e.session_id) for e in spawned] == [
        (str(project_id), str(session_id)),
        ("elsewhere", "s-other"),
    ]
    first = spawned[0]
    assert (first.event_type, first.agent_instance_id, first.agent_type_id) == (
        "spawn",
        str(agent_instance_id),
        "researcher",
    )
    assert first.metadata == {"run": 1}
    assert first.timestamp.tzinfo is not None
    assert len(pause_attempts) == 2  # failed once, ran again and succeeded
    assert paused[0].data["checkpoint_id"] == "cp-1"

    [letter] = [d for d in await dead_letters(redis, seed_env) if d["group"] == "seed-hooks"]
    assert (letter["group"], letter["reason"], letter["deliveries"]) == (
        "seed-hooks",
        "hook_failed",
        "3",
    )
    assert "always_broken raised RuntimeError: the terminate hook is broken" in letter["error"]
    original = orjson.loads(orjson.loads(letter["data"])["data"])
    assert (original["type"], original["session_id"]) == ("agent.terminated", str(session_id))
    pending = await redis.xpending(StreamKeys(seed_env.stream_prefix, 0).results, "seed-hooks")
    assert pending["pending"] == 0


def saw(seen: list[str], *session_ids: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all(session_id in seen for session_id in session_ids)

    return check


async def test_hooks_resume_after_a_restart_with_the_results_published_meanwhile(
    seed_env: Settings, redis: Redis
) -> None:
    seen: list[str] = []
    hooks = LifecycleHooks()
    hooks.on_spawn(lambda event: seen.append(event.session_id))

    stop, listening = asyncio.Event(), asyncio.Event()
    first_run = asyncio.create_task(
        hooks.serve("restartable", "consumer-a", stop=stop, ready=listening)
    )
    await listening.wait()
    with worker_process(seed_env):
        async with AgentLifecycleManager() as manager:
            await manager.spawn("p", "a", "before")
            await wait_until(saw(seen, "before"))
            stop.set()
            await first_run
            await manager.spawn("p", "a", "while-down")  # nobody serves the hooks now
            assert seen == ["before"]
            second_stop = asyncio.Event()
            second_run = asyncio.create_task(
                hooks.serve("restartable", "consumer-b", stop=second_stop)
            )
            await wait_until(saw(seen, "while-down"))
            second_stop.set()
            await second_run
    assert seen == ["before", "while-down"]


async def test_a_hook_meeting_an_outage_is_retried_without_using_up_its_deliveries(
    seed_env: Settings, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMWORKER_MAX_DELIVERIES", "1")  # one real failure would dead-letter
    get_settings.cache_clear()
    first_runs: list[str] = []
    webhook_calls: list[str] = []
    hooks = LifecycleHooks()
    hooks.on_spawn(lambda event: first_runs.append(event.session_id))

    @hooks.on_spawn
    async def webhook(event: LifecycleEvent) -> None:
        webhook_calls.append(event.session_id)
        if len(webhook_calls) <= 2:
            raise ConnectionRefusedError("the webhook's server is down")

    stop, listening = asyncio.Event(), asyncio.Event()
    serving = asyncio.create_task(hooks.serve("outage-hooks", stop=stop, ready=listening))
    await listening.wait()
    with worker_process(seed_env):
        async with AgentLifecycleManager() as manager:
            await manager.spawn("p", "a", "s-webhook")

        async def delivered() -> bool:
            return len(webhook_calls) == 3

        await wait_until(delivered)
    stop.set()
    await serving
    assert first_runs == ["s-webhook"]  # the hook that succeeded did not run again
    assert [d for d in await dead_letters(redis, seed_env) if d["group"] == "outage-hooks"] == []
    pending = await redis.xpending(StreamKeys(seed_env.stream_prefix, 0).results, "outage-hooks")
    assert pending["pending"] == 0


async def test_serving_hooks_in_memworkers_own_groups_is_refused(seed_env: Settings) -> None:
    for group in ("lifecycle", "consolidation"):
        with pytest.raises(ValueError, match="memworker's own"):
            await LifecycleHooks().serve(group)


async def test_a_new_hooks_group_starts_with_new_results_unless_asked_to_start_from_the_first(
    seed_env: Settings, redis: Redis
) -> None:
    from_now: list[str] = []
    from_first: list[str] = []
    now_hooks, first_hooks = LifecycleHooks(), LifecycleHooks()
    now_hooks.on_spawn(lambda event: from_now.append(event.session_id))
    first_hooks.on_spawn(lambda event: from_first.append(event.session_id))
    stop, now_ready, first_ready = asyncio.Event(), asyncio.Event(), asyncio.Event()
    with worker_process(seed_env):
        async with AgentLifecycleManager() as manager:
            await manager.spawn("p", "a", "earlier")
            serving = [
                asyncio.create_task(now_hooks.serve("from-now", stop=stop, ready=now_ready)),
                asyncio.create_task(
                    first_hooks.serve("from-first", stop=stop, ready=first_ready, from_start=True)
                ),
            ]
            await now_ready.wait()
            await first_ready.wait()
            await manager.spawn("p", "a", "later")
            await wait_until(saw(from_now, "later"))
            await wait_until(saw(from_first, "later"))
            stop.set()
            await asyncio.gather(*serving)
    assert from_now == ["later"]  # results are handled in order: "earlier" was never delivered
    assert from_first == ["earlier", "later"]


async def test_values_json_cannot_hold_are_refused_at_the_call_naming_the_parameter(
    seed_env: Settings, redis: Redis
) -> None:
    # Nothing is published: each call fails before it reaches Redis, saying which argument.
    lifecycle = StreamKeys(seed_env.stream_prefix, 0).lifecycle
    async with AgentLifecycleManager(timeout=0.5) as manager:
        with pytest.raises(TypeError, match="lessons_learned must be a list of strings, not str"):
            await manager.terminate("p", "agent-1", "s-types", lessons_learned="one lesson")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"lessons_learned\[1\] must be a string"):
            await manager.terminate("p", "agent-1", "s-types", lessons_learned=["a", 2])  # type: ignore[list-item]
        with pytest.raises(
            ValueError, match=r"\['initial_state'\]\['score'\] \(nan\) is not a JSON"
        ):
            await manager.spawn("p", "agent-1", "s-types", initial_state={"score": float("nan")})
        with pytest.raises(TypeError, match="initial_state must be a mapping"):
            await manager.spawn("p", "agent-1", "s-types", initial_state=[("a", 1)])  # type: ignore[arg-type]
    assert not await redis.exists(lifecycle)

    memory = await WorkingMemory.for_session("s-types", "p", "agent-1")
    try:
        with pytest.raises(TypeError, match=r"'ratio'.*\(inf\) is not a JSON number"):
            await memory.set("ratio", float("inf"))
        assert await memory.get("ratio") is None
    finally:
        await memory.close()


async def test_a_datetime_without_a_zone_is_stored_as_utc(seed_env: Settings, redis: Redis) -> None:
    memory = await WorkingMemory.for_session("s-naive", "p", "agent-1")
    try:
        await memory.set("when", datetime(2026, 1, 2, 3, 4, 5))
        assert await memory.get("when") == "2026-01-02T03:04:05+00:00"
    finally:
        await memory.close()
