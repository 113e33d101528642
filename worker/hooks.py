"""``LifecycleHooks``: the syndarix hook decorators, run for every applied lifecycle result.

Register callbacks with ``@hooks.on_spawn`` / ``on_pause`` / ``on_resume`` / ``on_terminate``;
each receives a ``LifecycleEvent``. Unlike the seed, where hooks ran inside the manager's call
and an error was logged and dropped, hooks here are served by ``await hooks.serve(group)``: a
consumer group on every shard's results stream, so they run for every command whoever
published it, and a restart resumes where the group left off. Delivery is at least once per
result; a hook that raises is retried with backoff and, after the delivery cap, the result is
dead-lettered with the hook's error. Rejected commands (``command.rejected``) run no hook.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from schemas.results import (
    AgentPaused,
    AgentResumed,
    AgentSpawned,
    AgentTerminated,
    Result,
)
from worker.lifecycle_manager import describe_result

__all__ = ["LifecycleEvent", "LifecycleHook", "LifecycleHooks"]

EVENT_TYPES: dict[type[Any], str] = {
    AgentSpawned: "spawn",
    AgentPaused: "pause",
    AgentResumed: "resume",
    AgentTerminated: "terminate",
}


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One applied lifecycle command, as the seed's hooks receive it.

    ``timestamp`` is when the worker applied it (UTC); ``metadata`` the command's (``{}``
    when it had none). Ours, after the seed's fields: ``data`` (the ``LifecycleResult.data``
    of the call: ``checkpoint_id``, ``episode_id`` …), the result's ``event_id`` and the
    result itself.
    """

    event_type: str
    project_id: str
    agent_instance_id: str
    agent_type_id: str | None
    session_id: str
    timestamp: datetime
    metadata: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    event_id: str = ""
    result: Result | None = None

    @classmethod
    def from_result(cls, result: Result) -> LifecycleEvent | None:
        """The event of an applied command's result; ``None`` for a rejection."""
        kind = EVENT_TYPES.get(type(result))
        if kind is None:
            return None
        _message, data = describe_result(result)
        return cls(
            event_type=kind,
            project_id=result.project_id or "",
            agent_instance_id=result.agent_instance_id or "",
            agent_type_id=result.agent_type_id,
            session_id=result.session_id or "",
            timestamp=result.occurred_at,
            metadata=dict(result.metadata or {}),
            data=data,
            event_id=result.event_id,
            result=result,
        )


LifecycleHook = Callable[[LifecycleEvent], Awaitable[Any] | Any]
"""A hook: a function or coroutine function taking the event; what it returns is ignored."""


class LifecycleHooks:
    """Callbacks per lifecycle event type, served from the results streams by ``serve``."""

    def __init__(self) -> None:
        self._hooks: dict[str, list[LifecycleHook]] = {
            kind: [] for kind in ("spawn", "pause", "resume", "terminate")
        }

    def _register(self, kind: str, hook: LifecycleHook) -> LifecycleHook:
        if not callable(hook):
            raise TypeError(f"a {kind} hook must be callable; got {hook!r:.80}")
        self._hooks[kind].append(hook)
        return hook

    def on_spawn(self, hook: LifecycleHook) -> LifecycleHook:
        """Register ``hook`` for spawns (usable as ``@hooks.on_spawn``)."""
        return self._register("spawn", hook)

    def on_pause(self, hook: LifecycleHook) -> LifecycleHook:
        return self._register("pause", hook)

    def on_resume(self, hook: LifecycleHook) -> LifecycleHook:
        return self._register("resume", hook)

    def on_terminate(self, hook: LifecycleHook) -> LifecycleHook:
        return self._register("terminate", hook)

    def hooks_for(self, event_type: str) -> list[LifecycleHook]:
        return list(self._hooks.get(event_type, ()))

    async def run(self, result: Result) -> int:
        """Run the hooks of one result in registration order; how many ran.

        The first hook that raises stops the others and its exception propagates (the
        result is then redelivered, and every hook of it runs again).
        """
        event = LifecycleEvent.from_result(result)
        if event is None:
            return 0
        hooks = self._hooks[event.event_type]
        for hook in hooks:
            outcome = hook(event)
            if inspect.isawaitable(outcome):
                await outcome
        return len(hooks)
