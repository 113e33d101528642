"""Result entries as the lifecycle worker publishes them, for the consolidator's tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.engine import create_database_engine
from worker.db.migrate import migrate
from worker.keys import StreamKeys, shard_of
from worker.settings import Settings

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _stamp(offset_s: float) -> str:
    return (T0 + timedelta(seconds=offset_s)).isoformat().replace("+00:00", "Z")


def base_result(
    type_: str, project_id: str | None, session_id: str | None, n: int = 0, **fields: Any
) -> dict[str, Any]:
    command_id = fields.pop("causation_id", None) or uuid.uuid4().hex
    command = {
        "agent.spawned": "spawn",
        "agent.paused": "pause",
        "agent.resumed": "resume",
        "agent.terminated": "terminate",
    }.get(type_)
    return {
        "event_id": fields.pop("event_id", None) or f"r-{command_id}",
        "type": type_,
        "causation_id": command_id,
        "command": fields.pop("command", command),
        "project_id": project_id,
        "session_id": session_id,
        "agent_instance_id": f"agent-{session_id}",
        "agent_type_id": "researcher",
        "seq": None,
        "correlation_id": None,
        "metadata": None,
        "occurred_at": _stamp(n),
        "duration_ms": 0.4,
        **fields,
    }


def snapshot(steps: int = 6, variables: int = 8) -> dict[str, Any]:
    return {
        "variables": {f"var_{i}": {"value": i, "note": "x" * 40} for i in range(variables)},
        "task_state": {
            "description": "collect sources",
            "current_step": 3,
            "total_steps": 5,
            "status": "in_progress",
            "progress": 60.0,
            "started_at": _stamp(0),
            "updated_at": _stamp(10),
            "data": {"retries": 1},
        },
        "scratchpad": [
            {"content": f"step {i}: looked at source {i}", "timestamp": _stamp(i)}
            for i in range(steps)
        ],
        "checkpoints": ["cp-1", "cp-2"],
    }


def terminated(
    project_id: str,
    session_id: str,
    n: int = 0,
    *,
    consolidate: bool = True,
    task_description: str = "Summarise the quarterly sales report",
    lessons: Iterable[str] = ("check the units first",),
    **fields: Any,
) -> dict[str, Any]:
    values: dict[str, Any] = {
        "outcome": "success",
        "items_cleared": 12,
        "consolidate": consolidate,
        "task_description": task_description,
        "lessons_learned": list(lessons),
        "tokens_used": 1234,
        "importance": 0.7,
        "started_at": _stamp(n - 60),
        "duration_seconds": 60.0,
    }
    result = base_result("agent.terminated", project_id, session_id, n, **(values | fields))
    if consolidate and "snapshot" not in result:
        result["snapshot"] = snapshot()
    return result


def session_story(project_id: str, session_id: str, n: int = 0) -> list[dict[str, Any]]:
    """spawn, pause, resume, a rejected command and terminate: one result of each type."""
    return [
        base_result("agent.spawned", project_id, session_id, n, initial_items=2, seq=1),
        base_result(
            "agent.paused", project_id, session_id, n + 1, checkpoint_id="cp-1", items_saved=2
        ),
        base_result(
            "agent.resumed", project_id, session_id, n + 2, checkpoint_id="cp-1", items_restored=2
        ),
        base_result(
            "command.rejected",
            project_id,
            session_id,
            n + 3,
            reason="invalid_transition",
            detail="the session is active; resume needs a paused session",
            command="resume",
        ),
        terminated(project_id, session_id, n + 4),
    ]


def results_stream(settings: Settings, result: Mapping[str, Any]) -> str:
    project, session = result.get("project_id"), result.get("session_id")
    shard = shard_of(project, session, settings.shards) if project and session else 0
    return StreamKeys(settings.stream_prefix, shard).results


async def publish(
    redis: Redis, settings: Settings, results: Iterable[Mapping[str, Any]], chunk: int = 1000
) -> int:
    """XADD each result as a ``data`` field to its shard's results stream."""
    count = 0
    pipe = redis.pipeline(transaction=False)
    for result in results:
        pipe.xadd(results_stream(settings, result), {"data": orjson.dumps(result)})
        count += 1
        if count % chunk == 0:
            await pipe.execute()
    await pipe.execute()
    return count


async def publish_raw(redis: Redis, stream: str, fields: Mapping[str, bytes | str]) -> str:
    entry_id = await redis.xadd(stream, dict(fields))  # type: ignore[arg-type]
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


@asynccontextmanager
async def migrated_engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    await migrate(database_url)
    engine = create_database_engine(database_url)
    try:
        yield engine
    finally:
        await engine.dispose()
