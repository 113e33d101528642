"""``AgentLifecycleManager``: the syndarix lifecycle manager's calls, applied by the worker.

Each call publishes one command on the session's lifecycle stream (``LifecycleClient``: fresh
``event_id``, next ``seq``) and awaits its result, so the lifecycle worker applies it exactly
once, atomically with its effect on working memory, whoever else publishes for the session.
The answer is the seed's ``LifecycleResult(success, event_type, message, data,
duration_ms)`` with the seed's ``data`` keys; a rejection is ``success=False`` with the
worker's sentence as ``message``, never an exception. Waiting longer than ``timeout`` for the
worker raises ``ResultTimeoutError``.

What differs from the seed, on purpose: the episode of a terminate is written to Postgres by
the consolidator after the call returns (``data["episode_id"]`` is the id it will have), and
checkpoints are made by the worker's own script, not stored under a key.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from schemas.results import (
    AgentPaused,
    AgentResumed,
    AgentSpawned,
    AgentTerminated,
    CommandRejected,
    Result,
)
from worker.db.models import episode_id_for
from worker.ids import id_text
from worker.lifecycle.client import LifecycleClient, ResultTimeoutError
from worker.memory.api import AnyId, WorkingMemory
from worker.memory.models import CheckpointInfo, rfc3339
from worker.settings import Settings

__all__ = ["AgentLifecycleManager", "LifecycleResult", "ResultTimeoutError"]

EventType = Literal["spawn", "pause", "resume", "terminate"]


@dataclass(frozen=True, slots=True)
class LifecycleResult:
    """What one lifecycle call did, in the seed's shape.

    ``event_type`` is the command (``spawn``, ``pause``, ``resume``, ``terminate``);
    ``duration_ms`` the time the call took, publish to result. ``data`` holds, on success:
    spawn ``initial_items``; pause ``checkpoint_id``, ``items_saved``, ``timestamp``;
    resume ``checkpoint_id``, ``items_restored``; terminate ``episode_id`` (``None`` without
    consolidation), ``items_cleared``, ``outcome``. On a rejection ``data`` is
    ``{"reason": …}`` and ``message`` the worker's sentence. The last three fields are ours:
    the command's ``event_id``, the rejection ``reason`` and the worker's result itself.
    """

    success: bool
    event_type: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    duration_ms: float = 0.0
    event_id: str | None = None
    reason: str | None = None
    result: Result | None = None


def _plain(value: Any) -> Any:
    """An enum member (the seeds pass their ``Outcome`` enum) as its value."""
    return value.value if isinstance(value, Enum) else value


def describe_result(result: Result) -> tuple[str, dict[str, Any]]:
    """The message and the seed's ``data`` of an applied command's result (shared by
    ``LifecycleResult`` and the hooks' ``LifecycleEvent``)."""
    where = f"session {result.project_id}/{result.session_id}"
    if isinstance(result, AgentSpawned):
        return (
            f"spawned {where} with {result.initial_items} items",
            {"initial_items": result.initial_items},
        )
    if isinstance(result, AgentPaused):
        return (
            f"paused {where}: checkpoint {result.checkpoint_id} saved {result.items_saved} items",
            {
                "checkpoint_id": result.checkpoint_id,
                "items_saved": result.items_saved,
                "timestamp": rfc3339(result.occurred_at),
            },
        )
    if isinstance(result, AgentResumed):
        return (
            f"resumed {where} from checkpoint {result.checkpoint_id} "
            f"({result.items_restored} items)",
            {"checkpoint_id": result.checkpoint_id, "items_restored": result.items_restored},
        )
    assert isinstance(result, AgentTerminated), result
    episode = str(episode_id_for(result.event_id)) if result.consolidate else None
    recorded = f"; episode {episode} will be recorded by the consolidator" if episode else ""
    return (
        f"terminated {where} ({result.outcome}), cleared {result.items_cleared} items{recorded}",
        {"episode_id": episode, "items_cleared": result.items_cleared, "outcome": result.outcome},
    )


class AgentLifecycleManager:
    """Spawn, pause, resume and terminate agent sessions through the lifecycle worker.

    Settings come from the environment unless ``settings`` is given; a ``client`` passed in
    stays the caller's (``close`` leaves it open). ``timeout`` bounds each wait for a result.
    """

    def __init__(
        self,
        client: LifecycleClient | None = None,
        *,
        settings: Settings | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._owns = client is None
        self.client = client if client is not None else LifecycleClient(settings=settings)
        self.settings = self.client.settings
        self.timeout = timeout

    async def __aenter__(self) -> AgentLifecycleManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the client, when this manager opened it."""
        if self._owns:
            await self.client.close()

    async def _call(
        self,
        kind: EventType,
        project_id: AnyId,
        agent_instance_id: AnyId,
        session_id: AnyId,
        metadata: Mapping[str, Any] | None,
        fields: Mapping[str, Any],
    ) -> LifecycleResult:
        given = {
            "project_id": project_id,
            "session_id": session_id,
            "agent_instance_id": agent_instance_id,
            **fields,
        }
        command: dict[str, Any] = {"type": kind}
        for name, value in given.items():
            if value is not None:  # ids may be UUIDs: their text goes on the wire
                command[name] = id_text(value, name) if name.endswith("_id") else value
        if metadata is not None:
            command["metadata"] = dict(_mapping(metadata, "metadata"))
        started = time.perf_counter()
        event_id = await self.client.publish(command)
        try:
            result = await self.client.wait(event_id, timeout=self.timeout)
        except ResultTimeoutError:
            raise ResultTimeoutError(
                f"{kind} of session {command['project_id']}/{command['session_id']} was "
                f"published (event_id {event_id}) but no result arrived within "
                f"{self.timeout:g}s: is a lifecycle worker (`memworker run`) running against "
                "this Redis and stream prefix? The command stays queued and is applied when "
                "one runs."
            ) from None
        duration_ms = (time.perf_counter() - started) * 1000
        if isinstance(result, CommandRejected):
            return LifecycleResult(
                success=False,
                event_type=kind,
                message=result.detail,
                data={"reason": result.reason},
                duration_ms=duration_ms,
                event_id=event_id,
                reason=result.reason,
                result=result,
            )
        message, data = describe_result(result)
        return LifecycleResult(
            success=True,
            event_type=kind,
            message=message,
            data=data,
            duration_ms=duration_ms,
            event_id=event_id,
            result=result,
        )

    async def spawn(
        self,
        project_id: AnyId,
        agent_instance_id: AnyId,
        session_id: AnyId,
        agent_type_id: AnyId | None = None,
        initial_state: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        ttl_seconds: int | None = None,
        user_id: AnyId | None = None,
    ) -> LifecycleResult:
        """Create the session; ``initial_state`` becomes its variables; ``user_id`` names the
        user it works for (its episode is that user's: ``EpisodeStore.recall(user_id=)``)."""
        _mapping(initial_state, "initial_state")
        return await self._call(
            "spawn",
            project_id,
            agent_instance_id,
            session_id,
            metadata,
            {
                "agent_type_id": agent_type_id,
                "initial_state": dict(initial_state or {}),
                "ttl_seconds": ttl_seconds,
                "user_id": user_id,
            },
        )

    async def pause(
        self,
        project_id: AnyId,
        agent_instance_id: AnyId,
        session_id: AnyId,
        checkpoint_id: AnyId | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        description: str | None = None,
    ) -> LifecycleResult:
        """Checkpoint the session (an id is generated when none is given) and pause it."""
        return await self._call(
            "pause",
            project_id,
            agent_instance_id,
            session_id,
            metadata,
            {
                "checkpoint_id": checkpoint_id,
                "description": description,
            },
        )

    async def resume(
        self,
        project_id: AnyId,
        agent_instance_id: AnyId,
        session_id: AnyId,
        checkpoint_id: AnyId | None = None,
        clear_current: bool = True,
        metadata: Mapping[str, Any] | None = None,
    ) -> LifecycleResult:
        """Restore a checkpoint (the newest when ``None``) and make the session active."""
        return await self._call(
            "resume",
            project_id,
            agent_instance_id,
            session_id,
            metadata,
            {
                "checkpoint_id": checkpoint_id,
                "clear_current": clear_current,
            },
        )

    async def terminate(
        self,
        project_id: AnyId,
        agent_instance_id: AnyId,
        session_id: AnyId,
        task_description: str | None = None,
        outcome: str | Enum = "success",
        lessons_learned: list[str] | None = None,
        consolidate_to_episodic: bool = True,
        cleanup_working: bool = True,
        metadata: Mapping[str, Any] | None = None,
        *,
        tokens_used: int | None = None,
        importance: float | None = None,
    ) -> LifecycleResult:
        """End the session. With ``consolidate_to_episodic`` the consolidator writes its
        episode (``data["episode_id"]``) after this returns; ``cleanup_working`` clears its
        working memory."""
        lessons = _strings(lessons_learned, "lessons_learned")
        return await self._call(
            "terminate",
            project_id,
            agent_instance_id,
            session_id,
            metadata,
            {
                "task_description": task_description,
                "outcome": _plain(outcome),
                "lessons_learned": lessons,
                "consolidate": consolidate_to_episodic,
                "cleanup": cleanup_working,
                "tokens_used": tokens_used,
                "importance": importance,
            },
        )

    async def list_checkpoints(
        self, project_id: AnyId, agent_instance_id: AnyId, session_id: AnyId
    ) -> list[CheckpointInfo]:
        """The session's checkpoints, oldest first, as ``WorkingMemory.list_checkpoints``."""
        memory = await WorkingMemory.for_session(
            session_id,
            project_id,
            agent_instance_id,
            redis=self.client.redis,
            settings=self.settings,
        )
        return await memory.list_checkpoints()


def _strings(value: Sequence[str] | None, name: str) -> list[str]:
    """A list of strings given as one (a str is a sequence of letters: refused, not split)."""
    if value is None:
        return []
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(
            f"{name} must be a list of strings, not {type(value).__name__}: {value!r:.60}"
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(f"{name}[{i}] must be a string, not {type(item).__name__}")
    return list(value)


def _mapping(value: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping (a dict), not {type(value).__name__}")
    return value
