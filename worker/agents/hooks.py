"""``LifecycleHooks``: the syndarix hook decorators, run for every applied lifecycle result.

Register callbacks with ``@hooks.on_spawn`` / ``on_pause`` / ``on_resume`` / ``on_terminate``;
each receives a ``LifecycleEvent``. Unlike the seed, where hooks ran inside the manager's call
and an error was logged and dropped, hooks here are served by ``await hooks.serve(group)``: a
consumer group on every shard's results stream, so they run for every command whoever
published it, and a restart resumes where the group left off. Delivery is at least once per
result; a hook that raises is retried with backoff for ``MEMWORKER_HOOK_RETRY_SECONDS`` (and at
least ``MEMWORKER_MAX_DELIVERIES`` times), then the result is dead-lettered with the hook's
error. A hook that meets an outage (``is_unavailable``) holds the
result without counting a failure. Rejected commands (``command.rejected``) run no hook.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from schemas.results import (
    RESULT_ADAPTER,
    AgentPaused,
    AgentResumed,
    AgentSpawned,
    AgentTerminated,
    Result,
)
from worker.agents.manager import describe_result
from worker.codec import entry_data
from worker.connections import AnyRedis, consumer_client
from worker.consumers.callbacks import (
    CallbackUnavailableError,
    create_groups_waiting,
    is_unavailable,
)
from worker.consumers.loop import (
    BatchOutcome,
    Failure,
    GroupConsumer,
    Rejection,
    StreamEntry,
    default_consumer_name,
)
from worker.ids import validate_id
from worker.keys import CONSOLIDATION_GROUP, LIFECYCLE_GROUP, StreamKeys
from worker.logs import get_logger
from worker.settings import Settings, get_settings

__all__ = ["LifecycleEvent", "LifecycleHook", "LifecycleHooks"]

log = get_logger("worker.agents.hooks")

HOOK_FAILED = "hook_failed"
"""The DLQ ``reason`` of a result whose hook kept raising."""
RESERVED_GROUPS = frozenset({LIFECYCLE_GROUP, CONSOLIDATION_GROUP})
_MAX_TRACKED = 4_096

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
        """Register ``hook`` for pauses (usable as ``@hooks.on_pause``)."""
        return self._register("pause", hook)

    def on_resume(self, hook: LifecycleHook) -> LifecycleHook:
        """Register ``hook`` for resumes (usable as ``@hooks.on_resume``)."""
        return self._register("resume", hook)

    def on_terminate(self, hook: LifecycleHook) -> LifecycleHook:
        """Register ``hook`` for terminations (usable as ``@hooks.on_terminate``)."""
        return self._register("terminate", hook)

    def hooks_for(self, event_type: str) -> list[LifecycleHook]:
        """The hooks registered for ``event_type`` (``spawn``, …), in registration order."""
        return list(self._hooks.get(event_type, ()))

    async def run(self, result: Result, done: set[int] | None = None) -> int:
        """Run the hooks of one result in registration order; how many ran.

        The first hook that raises stops the others and its exception propagates. ``done``
        collects the positions of the hooks that succeeded, and those are skipped when the
        same set is passed again: a retry runs only the hook that failed and those after it.
        """
        event = LifecycleEvent.from_result(result)
        if event is None:
            return 0
        done = set() if done is None else done
        ran = 0
        for position, hook in enumerate(self._hooks[event.event_type]):
            if position in done:
                continue
            outcome = hook(event)
            if inspect.isawaitable(outcome):
                await outcome
            done.add(position)
            ran += 1
        return ran

    async def serve(
        self,
        group: str,
        consumer: str | None = None,
        *,
        stop: asyncio.Event | None = None,
        ready: asyncio.Event | None = None,
        from_start: bool = False,
        redis: AnyRedis | None = None,
        settings: Settings | None = None,
    ) -> None:
        """Run the hooks for every result, as consumer ``consumer`` of group ``group``.

        The group reads every shard's results stream; several processes serving one group
        share the work, and a restarted one resumes where the group left off (entries a dead
        consumer held are taken over after ``MEMWORKER_RECLAIM_IDLE_MS``). A new group starts
        with the results published from now on, or with all retained results when
        ``from_start``. A result is acknowledged when all its hooks returned; a hook that
        raises is retried with backoff (only it and the hooks after it) for
        ``MEMWORKER_HOOK_RETRY_SECONDS`` (and at least ``MEMWORKER_MAX_DELIVERIES`` times),
        then the result goes to the DLQ with reason ``hook_failed`` and the hook's error. An
        outage only pauses it: Redis's, or one a hook meets (a refused or timed-out
        connection, a Redis that is loading, read-only, out of memory or busy), which holds
        the result and counts no failure against it.
        ``ready`` is set once the group exists on every results stream: results published
        after that reach the hooks. Runs until ``stop`` is set (the batch in hand is
        finished) or the task is cancelled.
        """
        validate_id(group, "group")
        if group in RESERVED_GROUPS:
            raise ValueError(
                f"group {group!r} is memworker's own; serving hooks in it would take its "
                "entries away from the worker or the consolidator. Choose another name."
            )
        settings = settings or get_settings()
        client = redis if redis is not None else consumer_client(settings)
        handler = _HookHandler(self, group, settings)
        stop = stop or asyncio.Event()
        try:
            if not await handler.create_groups(client, "0" if from_start else "$", stop):
                return
            if ready is not None:
                ready.set()
            await GroupConsumer.from_settings(
                client,
                handler,
                settings,
                consumer=consumer or default_consumer_name(),
                retry_window_s=settings.hook_retry_seconds,
            ).run(stop)
        finally:
            if redis is None:
                await client.aclose()


HookUnavailableError = CallbackUnavailableError
"""A hook met a server-wide condition: the results are held and retried, none counted."""


def _hook_name(hooks: LifecycleHooks, result: Result, done: set[int]) -> str:
    """The hook that raised: the first of the result's hooks not done."""
    event_type = EVENT_TYPES.get(type(result), "")
    for position, hook in enumerate(hooks.hooks_for(event_type)):
        if position not in done:
            return str(getattr(hook, "__qualname__", None) or repr(hook))
    return "a hook"


class _HookHandler:
    """``LifecycleHooks`` as a ``GroupHandler`` of the shared consumer-group loop."""

    storage_errors: tuple[type[BaseException], ...] = (HookUnavailableError,)
    failure_reason = HOOK_FAILED

    def __init__(self, hooks: LifecycleHooks, group: str, settings: Settings) -> None:
        self.hooks = hooks
        self.group = group
        shards = [StreamKeys(settings.stream_prefix, i) for i in range(settings.shards)]
        self.streams = [keys.results for keys in shards]
        self._dlq = {keys.results: keys.dlq for keys in shards}
        self._done: dict[tuple[str, str], set[int]] = {}
        """The hooks that succeeded, per recent entry (oldest forgotten first): an entry read
        again (a retry, or a batch cut short by an outage) runs only the hooks not done."""

    def dlq_stream(self, stream: str) -> str:
        return self._dlq[stream]

    async def create_groups(self, redis: AnyRedis, start: str, stop: asyncio.Event) -> bool:
        """Create the group where it does not exist yet, at ``start`` (``$``: after the last
        result, ``0``: at the first retained one), waiting out a Redis outage; ``False`` when
        ``stop`` was set first."""
        return await create_groups_waiting(redis, self.streams, self.group, start, stop, log)

    async def prepare(
        self, entries: Sequence[StreamEntry]
    ) -> list[tuple[StreamEntry, Result | str]]:
        """Each entry with its result, or why it is not one."""
        batch: list[tuple[StreamEntry, Result | str]] = []
        for entry in entries:
            data = entry_data(entry.fields)
            if data is None:
                batch.append((entry, "the entry has no 'data' field"))
                continue
            try:
                batch.append((entry, RESULT_ADAPTER.validate_json(data)))
            except ValidationError as exc:
                batch.append((entry, f"not a result: {exc.errors()[0]['msg']}"))
        return batch

    async def finish(self, batch: list[tuple[StreamEntry, Result | str]]) -> BatchOutcome:
        outcome = BatchOutcome()
        for entry, result in batch:
            if isinstance(result, str):
                outcome.rejected.append(Rejection(entry, "unparseable", result))
                continue
            key = (entry.stream, entry.entry_id)
            done = self._done.setdefault(key, set())
            if len(self._done) > _MAX_TRACKED:
                del self._done[next(iter(self._done))]
            try:
                await self.hooks.run(result, done)
            except Exception as exc:
                hook = _hook_name(self.hooks, result, done)
                error = f"hook {hook} raised {type(exc).__name__}: {exc}"
                if is_unavailable(exc):  # says nothing about this result: hold it, count nothing
                    raise HookUnavailableError(error) from exc
                outcome.failed.append(
                    Failure(
                        entry, error, {"event_id": result.event_id, "session_id": result.session_id}
                    )
                )
                continue
            outcome.done.append(entry)
        return outcome

    async def check_storage(self) -> None:
        """Hooks keep no storage of their own."""
