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
project, or of ten, no longer queue one by one behind a lock. A publish reads what its
projects owe in ``seq`` order under their locks, so a change committed after another returned
is always published after it (per user too), whoever triggers the publish. ``flush`` returns
once a publish that started after it is done; ``remember`` does not wait for it
(``publish_soon``): its turn and event are committed, the event owed until the publish that is
already on its way sends it (or, should the process die first, the project's next change,
``Memory.flush_changes()``, or the consolidator's sweep). A publish never waits on an
episode's row lock (``_OWED_AND_CLAIMED``): an announcement whose row another transaction
holds (the fact extractor's batch) is held back and tried again (``OwedPublisher._retry_held``).

**Retention.** The streams are trimmed like ``P:episodes`` (``consumers.retention``: below what
every group has acknowledged, keeping ``MEMWORKER_RETENTION_SECONDS``), by the consolidator.
``memworker forget`` deletes a forgotten user's entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
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
_OWED_AND_CLAIMED = text(
    "WITH free AS (SELECT id FROM episodes WHERE id = ANY(CAST(:a AS uuid[]))"
    " AND announced_at IS NULL FOR NO KEY UPDATE SKIP LOCKED),"
    " claimed AS (UPDATE episodes e SET announced_at = now() FROM free WHERE e.id = free.id"
    " RETURNING e.id)"
    " (SELECT 'owed' AS kind, seq, project_id, payload::text AS payload, NULL::uuid AS episode"
    " FROM memory_changes WHERE project_id = ANY(CAST(:ps AS text[])) ORDER BY seq LIMIT :n)"
    " UNION ALL SELECT 'claimed', NULL, NULL, NULL, id FROM claimed"
    " UNION ALL SELECT 'unmarked', NULL, NULL, NULL, id FROM episodes"
    " WHERE id = ANY(CAST(:a AS uuid[])) AND announced_at IS NULL"
)
"""``_OWED_MANY``, and the announcements' episodes claimed: marked announced (in this
transaction: undone should Redis refuse them), each only if unmarked and **not locked by
another transaction** (``SKIP LOCKED``). A publish never waits on an episode's row lock: the
fact extractor (``Memory.consolidate``) holds its batch's rows while it appends facts, and
those appends wait for a publish; a publish waiting on those rows deadlocked them. What is
locked is listed ``unmarked`` without being ``claimed`` (the statement's snapshot: marked
ones, another publish's or the relay's, are neither): held, tried again by a later publish."""
_DONE = text("DELETE FROM memory_changes WHERE seq = ANY(CAST(:s AS bigint[]))")
"""The events published leave the outbox."""
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
    published = await _publish(engine, redis, prefix, shards, project_ids, ())
    return published.events


class _RedisRefused(Exception):
    """Raised inside a publish's transaction when Redis refuses: its claims are rolled back."""


@dataclass
class Published:
    """What a publish did: events published, whether Redis took the announcements (else the
    relay owes them), the announcements held back by a row lock (``_OWED_AND_CLAIMED``)."""

    events: int
    announced: bool = True
    held: list[tuple[uuid.UUID, bytes]] = field(default_factory=list)


async def _publish(
    engine: AsyncEngine,
    redis: Redis | RedisCluster,
    prefix: str,
    shards: int,
    project_ids: Collection[str],
    announcements: Sequence[tuple[uuid.UUID, bytes]],
) -> Published:
    """Publish the projects' owed events and ``announcements`` (episode row id, its
    ``episode.recorded`` as JSON) on ``P:episodes``, in the same transactions and pipelines;
    an announcement goes only if its episode could be claimed (``_OWED_AND_CLAIMED``)."""
    projects = sorted(set(project_ids))
    done = Published(0)
    owed_announcements = list(dict(announcements).items())
    while True:
        rows: list[tuple[int, str, str]] = []  # (seq, project, the event's JSON)
        try:
            async with engine.begin() as conn:
                await conn.execute(_LOCK_MANY, {"ps": projects})
                sending: list[tuple[uuid.UUID, bytes]] = []
                if owed_announcements:
                    found = await conn.execute(
                        _OWED_AND_CLAIMED,
                        {
                            "ps": projects,
                            "n": PUBLISH_BATCH,
                            "a": [row_id for row_id, _wire in owed_announcements],
                        },
                    )
                    claimed: set[int] = set()  # the uuids' numbers: no UUID.__hash__ each
                    unmarked: set[int] = set()
                    for kind, seq, project_id, payload, episode in found:
                        if kind == "owed":
                            rows.append((seq, project_id, payload))
                        else:
                            (claimed if kind == "claimed" else unmarked).add(episode.int)
                    rows.sort()  # by seq
                    sending = [(k, wire) for k, wire in owed_announcements if k.int in claimed]
                    done.held = [
                        (k, wire)
                        for k, wire in owed_announcements
                        if k.int in unmarked and k.int not in claimed
                    ]
                elif projects:
                    found = await conn.execute(_OWED_MANY, {"ps": projects, "n": PUBLISH_BATCH})
                    rows = [(seq, project_id, payload) for seq, project_id, payload in found]
                owed_announcements = []
                if not rows and not sending:
                    return done
                try:
                    pipe = redis.pipeline(transaction=False)
                    streams: dict[str, str] = {}
                    for _seq, project_id, payload in rows:
                        stream = streams.get(project_id)
                        if stream is None:
                            stream = streams[project_id] = changes_stream(
                                prefix, project_id, shards
                            )
                        pipe.execute_command("XADD", stream, "*", "data", payload)  # xadd's
                    announced = episodes_stream(prefix)
                    for _row_id, wire in sending:
                        pipe.execute_command("XADD", announced, "*", "data", wire)
                    await pipe.execute()
                except RedisError as exc:
                    log.warning(
                        "change feed: events stay owed until Redis takes them",
                        project_id=projects[0] if len(projects) == 1 else projects,
                        owed=len(rows),
                        announcements=len(sending),
                        error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    )
                    done.announced, done.held = not sending, []
                    raise _RedisRefused from exc  # the claims roll back: the relay owes them
                if rows:
                    await conn.execute(_DONE, {"s": [seq for seq, _project, _data in rows]})
        except _RedisRefused:
            return done
        done.events += len(rows)
        if len(rows) < PUBLISH_BATCH:
            return done


HELD_RETRY_S = 0.05
"""How soon a publish tries again the announcements a row lock held back (doubling up to
``HELD_RETRY_MAX_S`` while they stay held)."""
HELD_RETRY_MAX_S = 1.0
HELD_GIVE_UP_S = 30.0
"""Announcements held back longer are left to the consolidator's relay (they stay unmarked:
``worker.episodes.announcements``)."""


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
        self._wake = asyncio.Event()
        self._held: list[tuple[uuid.UUID, bytes]] = []
        """Announcements a row lock held back (``_OWED_AND_CLAIMED``), for a later publish."""
        self._held_since = 0.0
        self._held_tries = 0
        self._announcing: set[uuid.UUID] = set()
        """Episodes whose announcement a publish holds (``publish_soon`` returns before it
        goes): a retry of the same turn meanwhile, still unmarked in Postgres, is not
        announced twice."""

    async def flush(
        self, project_id: str, announcements: Sequence[tuple[uuid.UUID, bytes]] = ()
    ) -> int:
        """Publish the project's owed events (and ``announcements``, ``_publish``) in a
        publish that starts after this call; how many events it published (of every project
        of that publish). Raises what the publish met (Postgres's error; a Redis that refuses
        only leaves them owed)."""
        published = await asyncio.shield(self._join(project_id, announcements))
        return published.events

    async def publish_soon(
        self, project_id: str, announcements: Sequence[tuple[uuid.UUID, bytes]] = ()
    ) -> None:
        """Have the project's owed events (and ``announcements``) published by the next
        publish, and return without waiting for it: a caller whose events are owed in a
        committed transaction goes on while they are sent (``seq`` keeps the order; a publish
        that fails leaves them owed, logged). Waits first while the publish queued behind the
        running one already holds ``PUBLISH_BATCH`` announcements: what waits in memory, and
        the feed's lag, stay bounded (two publishes' worth)."""
        queued, task = self._next, self._task
        if (
            queued is not None
            and len(queued.announcements) >= PUBLISH_BATCH
            and task is not None
            and not task.done()
            and task.get_loop() is asyncio.get_running_loop()
        ):
            with contextlib.suppress(Exception):  # logged by the publish (``_run``)
                await asyncio.shield(queued.future)
        self._join(project_id, announcements)

    def _join(
        self, project_id: str | None, announcements: Sequence[tuple[uuid.UUID, bytes]]
    ) -> asyncio.Future[Published]:
        """Join the next publish (starting the publisher if idle); its future."""
        loop = asyncio.get_running_loop()
        if self._task is not None and self._task.get_loop() is not loop:
            # a former event loop's (asyncio.run per call)
            self._task, self._next, self._announcing, self._held = None, None, set(), []
            self._wake = asyncio.Event()
        if self._next is None:
            future: asyncio.Future[Published] = loop.create_future()
            future.add_done_callback(_retrieve)
            self._next = _Round(future, set(), [])
        if project_id is not None:
            self._next.projects.add(project_id)
        for row_id, wire in announcements:
            if row_id not in self._announcing:
                self._announcing.add(row_id)
                self._next.announcements.append((row_id, wire))
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return self._next.future

    async def _run(self) -> None:
        """Publish for the callers waiting, round after round, until none waits and no
        announcement is held back (``_retry_held``)."""
        while self._next is not None or self._held:
            if self._next is None:
                await self._retry_held()
                continue
            round_, self._next = self._next, None
            self._wake.clear()
            round_.announcements.extend(self._held)
            self._held = []
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
                self._announcing.difference_update(k for k, _wire in round_.announcements)
                if not round_.future.done():
                    round_.future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                log.warning(
                    "change feed: events stay owed",
                    projects=sorted(round_.projects),
                    error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
                continue
            held = {k for k, _wire in result.held}
            self._announcing.difference_update(
                k for k, _wire in round_.announcements if k not in held
            )
            if result.held:
                if not self._held_since:
                    self._held_since = asyncio.get_running_loop().time()
                self._held = result.held
            else:
                self._held_since, self._held_tries = 0.0, 0
            if not round_.future.done():
                round_.future.set_result(result)

    async def _retry_held(self) -> None:
        """Only held-back announcements left: wait a little (or for a caller), then have a
        publish try them again; after ``HELD_GIVE_UP_S`` leave them to the relay."""
        now = asyncio.get_running_loop().time()
        if now - self._held_since > HELD_GIVE_UP_S:
            log.warning(
                "episode announcements held back by row locks: left to the relay",
                count=len(self._held),
            )
            self._announcing.difference_update(k for k, _wire in self._held)
            self._held, self._held_since, self._held_tries = [], 0.0, 0
            return
        pause = min(HELD_RETRY_MAX_S, HELD_RETRY_S * 2**self._held_tries)
        self._held_tries += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), pause)
        if self._next is None:
            self._join(None, ())

    async def close(self) -> None:
        """Stop a publish of a former caller still running (what it owed stays owed)."""
        task, self._task, self._next, self._announcing = self._task, None, None, set()
        self._held, self._held_since, self._held_tries = [], 0.0, 0
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            return  # done, or a former event loop's
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass
class _Round:
    """The callers of the next publish: its result, their projects, their announcements."""

    future: asyncio.Future[Published]
    projects: set[str]
    announcements: list[tuple[uuid.UUID, bytes]]


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a publish's failure seen: every caller waiting on it may have been cancelled."""
    if not future.cancelled():
        future.exception()
