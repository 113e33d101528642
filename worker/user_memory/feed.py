"""Following the change feed: ``follow_changes(handler, group)`` calls ``handler(event)`` for
every change to memory (``P:changes:{j}``), on the one consumer-group loop every memworker
group runs (``worker.consumers.loop``).

Like ``LifecycleHooks.serve``: several processes following one group share the events, a
restarted one resumes where its group left off (what a dead consumer held is taken over after
``MEMWORKER_RECLAIM_IDLE_MS``), an event is acknowledged when ``handler`` returned, a handler
that raises is retried with backoff (``MEMWORKER_HOOK_RETRY_SECONDS``, at least
``MEMWORKER_MAX_DELIVERIES`` times) and then dead-lettered to ``P:dlq:changes`` with its error,
and an outage (Redis's, or a server-wide condition the handler meets) only pauses it. Events
are ``schemas.streams.ChangeEvent`` models: ids and counts, never content. The feed is
trimmed below what every group has acknowledged (``Consolidator.trim_once``), so a group that
stops holds the feed back: delete a group no longer followed (``XGROUP DESTROY``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import ValidationError

from schemas.streams import CHANGE_EVENT_ADAPTER, ChangeEvent
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
from worker.keys import all_changes_streams, changes_dlq
from worker.logs import get_logger
from worker.settings import Settings

log = get_logger("worker.user_memory.feed")

ChangeHandler = Callable[[ChangeEvent], Awaitable[None]]
RESERVED = frozenset({"indexer"})
"""Groups of memworker's own on the feed."""


def feed_dlq(prefix: str) -> str:
    return changes_dlq(prefix)


class _FeedHandler:
    """A ``ChangeHandler`` as a ``GroupHandler`` of the shared loop."""

    storage_errors: tuple[type[BaseException], ...] = (CallbackUnavailableError,)
    failure_reason = "handler_failed"

    def __init__(self, handler: ChangeHandler, group: str, settings: Settings) -> None:
        self.handler = handler
        self.group = group
        self.streams = all_changes_streams(settings.stream_prefix, settings.shards)
        self._dlq = feed_dlq(settings.stream_prefix)

    def dlq_stream(self, stream: str) -> str:
        return self._dlq

    async def prepare(self, entries: Sequence[StreamEntry]) -> list[tuple[StreamEntry, Any]]:
        batch: list[tuple[StreamEntry, Any]] = []
        for entry in entries:
            data = entry_data(entry.fields)
            if data is None:
                batch.append((entry, "no 'data' field"))
                continue
            try:
                batch.append((entry, CHANGE_EVENT_ADAPTER.validate_json(data)))
            except ValidationError as exc:
                batch.append((entry, f"not a change event: {exc.errors()[0]['msg']}"))
        return batch

    async def finish(self, batch: list[tuple[StreamEntry, Any]]) -> BatchOutcome:
        outcome = BatchOutcome()
        for entry, event in batch:
            if isinstance(event, str):
                outcome.rejected.append(Rejection(entry, "unparseable", event))
                continue
            try:
                await self.handler(event)
            except Exception as exc:
                error = f"handler raised {type(exc).__name__}: {exc}"
                if is_unavailable(exc):  # says nothing about this event: hold it, count nothing
                    raise CallbackUnavailableError(error) from exc
                outcome.failed.append(Failure(entry, error, {"event_id": event.event_id}))
                continue
            outcome.done.append(entry)
        return outcome

    async def check_storage(self) -> None:
        """A handler keeps no storage memworker knows of."""


async def follow_changes(
    handler: ChangeHandler,
    group: str,
    consumer: str | None = None,
    *,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    from_start: bool = False,
    redis: AnyRedis | None = None,
    settings: Settings | None = None,
) -> None:
    """Call ``handler`` for every change event, as ``consumer`` of group ``group`` (module
    doc). A new group starts with the events published from now on, or all retained ones
    when ``from_start``; ``ready`` is set once the group exists on every feed stream. Runs
    until ``stop`` is set or the task is cancelled."""
    validate_id(group, "group")
    if group in RESERVED:
        raise ValueError(f"group {group!r} is memworker's own on the change feed: choose another")
    settings = settings or Settings()
    client = redis if redis is not None else consumer_client(settings)
    feed = _FeedHandler(handler, group, settings)
    stop = stop or asyncio.Event()
    try:
        if not await create_groups_waiting(
            client, feed.streams, group, "0" if from_start else "$", stop, log
        ):
            return
        if ready is not None:
            ready.set()
        await GroupConsumer.from_settings(
            client,
            feed,
            settings,
            consumer=consumer or default_consumer_name(),
            retry_window_s=settings.hook_retry_seconds,
        ).run(stop)
    finally:
        if redis is None:
            await client.aclose()
