"""The change feed: every change to memory (a user's blocks, episodes and facts, and an episode
becoming findable by meaning), published in order on ``P:changes:{i}``.

Events: ``block.updated``, ``episode.remembered``, ``episode.recallable`` (the indexer embedded
it: findable by meaning now), ``fact.added``, ``fact.superseded``, ``memory.forgotten``. Each is
JSON with ``type``, ``event_id`` (deterministic: a subscriber drops a duplicate),
``project_id``, ``user_id``, ``occurred_at`` and ids (episode, fact, block name, counts):
**never content**, so the feed is no copy of what a user told an agent. Read the content from
``Memory``.

**Outbox.** A change writes its event into ``memory_changes`` in the transaction that makes the
change, and ``publish_owed`` moves the project's owed events to its stream (XADD, then DELETE)
under a per-project advisory lock, in ``seq`` order. It runs after every change; what a Redis
outage leaves owed goes with the project's next change, ``Memory.flush_changes()``, or
``Memory.close()``, or the consolidator's sweep (``publish_all_owed``, every
``MEMWORKER_RETENTION_INTERVAL_SECONDS``). So an event is never lost and, without a crash
between XADD and DELETE (the DELETE's commit does not wait for the WAL flush: a Postgres crash
just after it counts as one), published once.

**Group commit.** The ``Memory`` instances of a process that share an engine and a Redis
client publish through one ``OwedPublisher`` (``worker.user_memory.writes.shared_writes``):
the callers whose changes committed while a publish ran share the next one, whatever their
project (one transaction taking their projects' locks in order, one read, one pipeline for all
of them, with the turns' ``episode.recorded`` announcements), so concurrent agents of a
project, or of ten, no longer queue one by one behind a lock. A caller returns once a
publish that started after its commit is done, so the order stays the order of ``seq``: a
change committed after another returned is always published after it (per user too).

**Retention.** The streams are trimmed like ``P:episodes`` (``consumers.retention``: below what
every group has acknowledged, keeping ``MEMWORKER_RETENTION_SECONDS``), by the consolidator.
``memworker forget`` deletes a forgotten user's entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from worker.db.models import EPISODE_NAMESPACE
from worker.ids import uuid5_text
from worker.keys import changes_stream, episodes_stream
from worker.logs import get_logger

log = get_logger("worker.episodes.changes")

CHANGE_TYPES = (
    "block.updated",
    "episode.remembered",
    "episode.recallable",
    "fact.added",
    "fact.superseded",
    "memory.forgotten",
)

_OWE = text(
    "INSERT INTO memory_changes (project_id, payload)"
    " SELECT p, CAST(e AS jsonb) FROM unnest(CAST(:ps AS text[]), CAST(:es AS text[]))"
    " WITH ORDINALITY AS o(p, e, n) ORDER BY n"
)
_LOCK_MANY = text(
    "SELECT pg_advisory_xact_lock(hashtextextended('memory_changes/' || p, 0)),"
    " set_config('synchronous_commit', 'off', true)"
    " FROM unnest(CAST(:ps AS text[])) AS p ORDER BY p"
)
"""The projects' outbox locks, in order (two publishers of overlapping projects never deadlock;
volatile functions of the select list run after its ORDER BY); and the publish's commit does
not wait for its WAL flush: what it records (events and announcements gone out) was already
published, so a Postgres crash that loses it publishes them again (a duplicate by
``event_id``), never loses one."""
_OWED_MANY = text(
    "SELECT seq, project_id, payload::text AS payload FROM memory_changes"
    " WHERE project_id = ANY(CAST(:ps AS text[])) ORDER BY seq LIMIT :n"
)
_DONE = text(
    "WITH done AS (DELETE FROM memory_changes WHERE seq = ANY(CAST(:s AS bigint[])))"
    " UPDATE episodes SET announced_at = now() WHERE id = ANY(CAST(:a AS uuid[]))"
)
"""The events published leave the outbox and the announcements published are marked
(``worker.db.batch.mark_announced``), in one statement."""
PUBLISH_BATCH = 1_000
"""Events a publish moves in one transaction and pipeline (a ``remember_many`` batch's)."""


def change_event(
    kind: str, project_id: str, user_id: str | None, key: str, **fields: Any
) -> dict[str, Any]:
    """An event of the feed: ``key`` (what changed, with the type) makes its ``event_id``."""
    assert kind in CHANGE_TYPES, kind
    now = datetime.now(UTC).isoformat()
    return {
        "type": kind,
        "event_id": uuid5_text(EPISODE_NAMESPACE, f"{kind}:{project_id}/{key}/{now}"),
        "project_id": project_id,
        "user_id": user_id,
        "occurred_at": now,
        **fields,
    }


async def owe(conn: AsyncConnection, project_id: str, events: list[dict[str, Any]]) -> None:
    """Record ``events`` in the outbox, inside the caller's transaction (one statement)."""
    await owe_many(conn, [(project_id, event) for event in events])


async def owe_many(conn: AsyncConnection, events: list[tuple[str, dict[str, Any]]]) -> None:
    """Record ``(project_id, event)`` pairs in the outbox, in order, in one statement."""
    if events:
        await conn.execute(
            _OWE,
            {
                "ps": [project for project, _e in events],
                "es": [orjson.dumps(event).decode() for _p, event in events],
            },
        )


async def publish_owed(
    engine: AsyncEngine,
    redis: Redis | RedisCluster,
    prefix: str,
    shards: int,
    project_id: str,
) -> int:
    """Publish the project's owed events, oldest first; how many. A Redis that refuses leaves
    them owed (logged once per call) and returns what was published before."""
    return await publish_owed_many(engine, redis, prefix, shards, [project_id])


async def publish_all_owed(
    engine: AsyncEngine, redis: Redis | RedisCluster, prefix: str, shards: int
) -> int:
    """Publish every project's owed events; how many. The consolidator's sweep: what a Redis
    outage left owed to a project that has made no change since goes out once Redis is back,
    not only with that project's next change."""
    async with engine.connect() as conn:
        found = await conn.execute(text("SELECT DISTINCT project_id FROM memory_changes"))
        projects = sorted(found.scalars())
    if not projects:
        return 0
    return await publish_owed_many(engine, redis, prefix, shards, projects)


async def publish_owed_many(
    engine: AsyncEngine,
    redis: Redis | RedisCluster,
    prefix: str,
    shards: int,
    project_ids: Collection[str],
) -> int:
    """``publish_owed`` for several projects at once: one transaction (their locks taken in
    order), one read, one pipeline and one DELETE per ``PUBLISH_BATCH`` events, each project's
    in ``seq`` order on its own stream (the indexer's batch owes events to many projects)."""
    published, _announced = await _publish(engine, redis, prefix, shards, project_ids, ())
    return published


async def _publish(
    engine: AsyncEngine,
    redis: Redis | RedisCluster,
    prefix: str,
    shards: int,
    project_ids: Collection[str],
    announcements: Sequence[tuple[uuid.UUID, bytes]],
) -> tuple[int, bool]:
    """Publish the projects' owed events and ``announcements`` (episode row id, its
    ``episode.recorded`` as JSON) on ``P:episodes``, marking those announced, in the same
    transactions and pipelines; (events published, whether the announcements went)."""
    projects = sorted(set(project_ids))
    published = 0
    owed_announcements = list(announcements)
    while projects:
        async with engine.begin() as conn:
            await conn.execute(_LOCK_MANY, {"ps": projects})
            rows = (await conn.execute(_OWED_MANY, {"ps": projects, "n": PUBLISH_BATCH})).all()
            if not rows and not owed_announcements:
                return published, True
            try:
                pipe = redis.pipeline(transaction=False)
                for row in rows:
                    pipe.xadd(changes_stream(prefix, row.project_id, shards), {"data": row.payload})
                for _row_id, wire in owed_announcements:
                    pipe.xadd(episodes_stream(prefix), {"data": wire})
                await pipe.execute()
            except RedisError as exc:
                log.warning(
                    "change feed: events stay owed until Redis takes them",
                    project_id=projects[0] if len(projects) == 1 else projects,
                    owed=len(rows),
                    announcements=len(owed_announcements),
                    error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
                return published, not owed_announcements
            done = [row.seq for row in rows]
            announced = [row_id for row_id, _wire in owed_announcements]
            await conn.execute(_DONE, {"s": done, "a": announced})
            owed_announcements = []
        published += len(rows)
        if len(rows) < PUBLISH_BATCH:
            return published, True
    return published, True


class OwedPublisher:
    """Group commit of the outboxes of every project written through one engine and Redis
    client (module doc): ``flush(project)`` publishes what the project owes, sharing a publish
    with the callers, of any project, that came while the one before it ran."""

    def __init__(
        self, engine: AsyncEngine, redis: Redis | RedisCluster, prefix: str, shards: int
    ) -> None:
        self.engine = engine
        self.redis = redis
        self.prefix = prefix
        self.shards = shards
        self._next: _Round | None = None
        self._task: asyncio.Task[None] | None = None

    async def flush(
        self, project_id: str, announcements: Sequence[tuple[uuid.UUID, bytes]] = ()
    ) -> int:
        """Publish the project's owed events (and ``announcements``, ``_publish``) in a
        publish that starts after this call; how many events it published (of every project
        of that publish). Raises what the publish met (Postgres's error; a Redis that refuses
        only leaves them owed)."""
        published, _announced = await self.flush_announcing(project_id, announcements)
        return published

    async def flush_announcing(
        self, project_id: str, announcements: Sequence[tuple[uuid.UUID, bytes]] = ()
    ) -> tuple[int, bool]:
        """``flush``, and whether the announcements went (else the relay owes them)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and self._task.get_loop() is not loop:
            self._task, self._next = None, None  # a former event loop's (asyncio.run per call)
        if self._next is None:
            future: asyncio.Future[tuple[int, bool]] = loop.create_future()
            future.add_done_callback(_retrieve)
            self._next = _Round(future, set(), [])
        self._next.projects.add(project_id)
        self._next.announcements.extend(announcements)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return await asyncio.shield(self._next.future)

    async def _run(self) -> None:
        """Publish for the callers waiting, round after round, until none waits."""
        while self._next is not None:
            round_, self._next = self._next, None
            try:
                result = await _publish(
                    self.engine,
                    self.redis,
                    self.prefix,
                    self.shards,
                    round_.projects,
                    round_.announcements,
                )
            except BaseException as exc:
                if not round_.future.done():
                    round_.future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            if not round_.future.done():
                round_.future.set_result(result)

    async def close(self) -> None:
        """Stop a publish of a former caller still running (what it owed stays owed)."""
        task, self._task, self._next = self._task, None, None
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            return  # done, or a former event loop's
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass
class _Round:
    """The callers of the next publish: its result, their projects, their announcements."""

    future: asyncio.Future[tuple[int, bool]]
    projects: set[str]
    announcements: list[tuple[uuid.UUID, bytes]]


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a publish's failure seen: every caller waiting on it may have been cancelled."""
    if not future.cancelled():
        future.exception()
