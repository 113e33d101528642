"""Code written against the syndarix / LoomFlow APIs runs unchanged on memworker.

The calls below are shaped the way the seeds' callers make them: positional ids given as
``uuid.UUID``, settings from the environment, ``ttl_seconds=``, ``progress_percent=``,
``checkpoint["id"]``, ``stats["user_keys"]``, ``except MemoryNotFoundError``, the lifecycle
manager's four calls and their ``data``. Real Redis, a real ``memworker run`` subprocess, and
the consolidator writing to a real Postgres.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from tests.helpers import worker_process
from worker import AgentLifecycleManager, LifecycleResult
from worker.client import ResultTimeoutError
from worker.consolidator import Consolidator
from worker.db.models import Episode
from worker.memory import MemoryNotFoundError, TaskState, WorkingMemory
from worker.migrate import migrate
from worker.settings import Settings, get_settings

pytestmark = pytest.mark.slow


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

        await memory.set("budget", 99)  # changed while paused, undone by the resume
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
            outcome="success",
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
