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
``Memory.close()``. So an event is never lost and, without a crash between XADD and DELETE,
published once.

**Retention.** The streams are trimmed like ``P:episodes`` (``consumers.retention``: below what
every group has acknowledged, keeping ``MEMWORKER_RETENTION_SECONDS``), by the consolidator.
``memworker forget`` deletes a forgotten user's entries.
"""

from __future__ import annotations

from collections.abc import Collection
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
from worker.keys import changes_stream
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
    "SELECT pg_advisory_xact_lock(hashtextextended('memory_changes/' || p, 0))"
    " FROM unnest(CAST(:ps AS text[])) AS p ORDER BY p"
)
"""The projects' outbox locks, in order (two publishers of overlapping projects never deadlock;
volatile functions of the select list run after its ORDER BY)."""
_OWED_MANY = text(
    "SELECT seq, project_id, payload::text AS payload FROM memory_changes"
    " WHERE project_id = ANY(CAST(:ps AS text[])) ORDER BY seq LIMIT :n"
)
_DONE = text("DELETE FROM memory_changes WHERE seq = ANY(:s)")
PUBLISH_BATCH = 500


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
    projects = sorted(set(project_ids))
    published = 0
    while projects:
        async with engine.begin() as conn:
            await conn.execute(_LOCK_MANY, {"ps": projects})
            rows = (await conn.execute(_OWED_MANY, {"ps": projects, "n": PUBLISH_BATCH})).all()
            if not rows:
                return published
            try:
                pipe = redis.pipeline(transaction=False)
                for row in rows:
                    pipe.xadd(changes_stream(prefix, row.project_id, shards), {"data": row.payload})
                await pipe.execute()
            except RedisError as exc:
                log.warning(
                    "change feed: events stay owed until Redis takes them",
                    project_id=projects[0] if len(projects) == 1 else projects,
                    owed=len(rows),
                    error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
                return published
            await conn.execute(_DONE, {"s": [row.seq for row in rows]})
        published += len(rows)
        if len(rows) < PUBLISH_BATCH:
            return published
    return published
