"""Forget a project (or one session of it, or its history before a time) everywhere we keep it.

``forget_everywhere`` is what ``memworker forget``, ``EpisodeStore.forget`` and
``forget_project`` run; it returns a ``ForgetReceipt`` (what was removed, where, how many;
what could not be). In this order, so that nothing forgotten can come back:

1. **Live sessions are marked.** Each session of the scope found in Redis (live, paused or a
   tombstone) loses its working memory and checkpoints, and its ``meta`` hash becomes a marker
   (``state: forgotten`` and when), in one MULTI: from then on the apply function rejects every
   command for it ``forgotten`` (a result with ids only) and its working memory refuses writes.
   A marker expires after ``marker_ttl_ms`` (the tombstone window): the session id is then free.
2. **The erasure record and Postgres, in one transaction** under the project's advisory lock
   (the consolidator holds it shared while it writes): a row of ``erasures`` (ids, the cutoff,
   the counts; never content), then the ``episodes`` (their vectors go with them, ``ON DELETE
   CASCADE``) and ``lifecycle_events`` rows. The cutoff is the later of Postgres's clock once
   the lock is held and Redis's (stream ids), or ``before``: the consolidator stores no result
   of the scope that occurred before it. (Clocks of the worker's hosts are assumed within
   milliseconds of these; a result stamped by a clock running behind is still covered.)
3. **``P:erased``** (``worker.erasure.erased``) gets the same cutoff, for the replay of commands and
   the DLQ's redrive.
4. **Every stream under the prefix** (commands, results, ``P:episodes``, every DLQ, anything a
   replay published there): each entry that carries the scope and is older than the cutoff is
   acknowledged in every group of its stream and deleted (XACK and XDEL in one MULTI), so no
   group keeps it pending. Readers already handle gaps: trimming (``MINID``) and replay ranges
   (``XRANGE``) skip them, and a deleted entry a consumer still held comes back without fields
   and is only acknowledged. The ``memory.forgotten`` events and the ``forgotten`` rejections
   (ids only) are kept.
5. Sessions seen only in Postgres or the streams are marked too (as in 1); the project's
   (session's) ``seq`` counters and its dedupe records of refused commands are deleted.
6. **``memory.forgotten``** on ``P:episodes``: the receipt's counts, no content.

With ``before``, only history older than it goes (rows and stream entries): live sessions and
their keys are live state, never "older". ``dry_run`` counts and changes nothing.

With ``user_id``, only that user's data in the project (or session) goes
(``worker.erasure.users``): the user's sessions (live ones by their ``meta``, finished
ones by their episodes, results and stream entries) and everything of them as above, the
user's turns, facts, blocks and change-feed rows and entries; the erasure record names the
user, so it covers the user's data only. ``''`` is the anonymous bucket (data of no user).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy import ColumnElement, column, delete, func, insert, select, table, update
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from worker import codec
from worker.db.erasures import lock_project
from worker.db.models import Episode, Erasure, LifecycleEvent
from worker.db.vectors import VECTOR_TABLE, has_vector_table
from worker.erasure.erased import record_erased
from worker.erasure.scope import ForgetReceipt, row_scope, user_key
from worker.erasure.streams import FORGOTTEN_EVENT, UserScope, scrub_streams
from worker.erasure.users import (
    forget_user_tables,
    live_user_sessions,
    user_sessions,
)
from worker.errors import one_line
from worker.ids import validate_id
from worker.keys import (
    FORGOTTEN_STATE,
    SessionKeys,
    episodes_stream,
    escape_glob,
    shard_of,
    working_memory_key_re,
    working_memory_pattern,
)

SCAN_COUNT = 1_000
DELETE_BATCH = 500
MARK_CONCURRENCY = 32
"""Sessions marked at once (a MULTI each: their keys share a slot, sessions do not)."""
DEFAULT_MARKER_TTL_MS = 3_600_000
"""How long a forgotten session's marker is kept when the caller does not say (the default
tombstone window, ``MEMWORKER_TOMBSTONE_TTL_SECONDS``)."""


@dataclass(slots=True)
class _Found:
    """Sessions of the scope seen anywhere, and the result ids of deleted results."""

    sessions: set[str] = field(default_factory=set)
    marked: set[str] = field(default_factory=set)
    result_ids: set[str] = field(default_factory=set)
    episode_ids: set[str] = field(default_factory=set)


async def forget_everywhere(
    engine: AsyncEngine,
    redis: Redis | None,
    prefix: str | None,
    project_id: str,
    *,
    session_id: str | None = None,
    before: datetime | None = None,
    dry_run: bool = False,
    marker_ttl_ms: int = DEFAULT_MARKER_TTL_MS,
    shards: int | None = None,
    user_id: str | None = None,
    anonymous_user: bool = False,
) -> ForgetReceipt:
    """Forget the scope everywhere (see the module doc); never raises for one place that
    fails: its error is in ``receipt.errors`` and the other places are still cleared.
    ``shards``: ``MEMWORKER_SHARDS`` (default: as the streams under the prefix show it).
    ``user_id``: only that user's data; ``anonymous_user``: only the data of no user."""
    validate_id(project_id, "project_id")
    if session_id is not None:
        validate_id(session_id, "session_id")
    receipt = ForgetReceipt(
        project_id, session_id, before, dry_run, user_key(user_id, anonymous_user)
    )
    found = _Found()
    live = redis is not None and prefix is not None
    if live and before is None:
        assert redis is not None and prefix is not None
        await _step(
            receipt,
            "redis working memory",
            _mark_live(redis, prefix, receipt, found, marker_ttl_ms),
        )
    redis_now = None
    if live:  # the cutoff is the later of Redis's clock (stream ids) and Postgres's
        assert redis is not None
        with contextlib.suppress(Exception):  # unreachable: its own steps will say so
            seconds, micros = await redis.time()
            redis_now = datetime.fromtimestamp(seconds + micros / 1e6, UTC)
    await _step(receipt, "postgres", _forget_rows(engine, receipt, found, redis_now))
    if not live:
        return receipt
    assert redis is not None and prefix is not None
    cutoff_ms = _ms(receipt.cutoff or datetime.now(UTC))
    if not dry_run:
        await _step(
            receipt,
            "redis erasure record",
            record_erased(
                redis,
                prefix,
                project_id,
                session_id,
                cutoff_ms,
                user_id=receipt.user_id,
                shards=shards or await _shard_count(redis, prefix),
            ),
        )
    await _step(receipt, "redis streams", _scrub_streams(redis, prefix, receipt, found, cutoff_ms))
    if before is None:
        shards = shards or await _shard_count(redis, prefix)
        await _step(
            receipt,
            "redis sessions",
            _mark_seen(redis, prefix, shards, receipt, found, marker_ttl_ms),
        )
        await _step(receipt, "redis counters", _forget_counters(redis, prefix, receipt, found))
    if not dry_run:
        await _step(receipt, "memory.forgotten event", _announce(redis, prefix, receipt))
        await _step(receipt, "postgres erasure counts", _store_counts(engine, receipt))
    return receipt


async def _step(receipt: ForgetReceipt, where: str, work: Any) -> None:
    try:
        await work
    except Exception as exc:  # the receipt says what could not be removed; the rest goes on
        receipt.errors.append(f"{where}: {one_line(exc)}")


def _ms(instant: datetime) -> int:
    return int(instant.timestamp() * 1000)


# -- 1 and 5: sessions ---------------------------------------------------------------------------


async def _mark_live(
    redis: Redis, prefix: str, receipt: ForgetReceipt, found: _Found, ttl_ms: int
) -> None:
    if receipt.user_id is not None:  # the user's live sessions only: their meta names the user
        mine = await live_user_sessions(
            redis, prefix, receipt.project_id, receipt.session_id, receipt.user_id
        )
        keys = [
            SessionKeys(prefix, shard, receipt.project_id, s) for s, shard in sorted(mine.items())
        ]
        await _mark_all(redis, keys, receipt, found, ttl_ms)
        return
    shard_re = working_memory_key_re(prefix, receipt.project_id, receipt.session_id)
    sessions: dict[str, int] = {}
    pattern = working_memory_pattern(prefix, receipt.project_id, receipt.session_id)
    async for raw in redis.scan_iter(match=pattern, count=SCAN_COUNT):
        key = codec.text(raw)
        if (match := shard_re.match(key)) is not None:
            shard = int(key[len(prefix) + 2 : key.index("}", len(prefix))])
            sessions.setdefault(match["session"], shard)
    await _mark_all(
        redis,
        [
            SessionKeys(prefix, shard, receipt.project_id, s)
            for s, shard in sorted(sessions.items())
        ],
        receipt,
        found,
        ttl_ms,
    )


async def _mark_all(
    redis: Redis, sessions: list[SessionKeys], receipt: ForgetReceipt, found: _Found, ttl_ms: int
) -> None:
    """``_mark`` each session, ``MARK_CONCURRENCY`` at a time (each is its own MULTI)."""
    for at in range(0, len(sessions), MARK_CONCURRENCY):
        part = sessions[at : at + MARK_CONCURRENCY]
        await asyncio.gather(*(_mark(redis, keys, receipt, found, ttl_ms) for keys in part))


async def _mark(
    redis: Redis, keys: SessionKeys, receipt: ForgetReceipt, found: _Found, ttl_ms: int
) -> None:
    """Working memory gone, ``meta`` a marker: one MULTI (the session's keys share a slot)."""
    found.sessions.add(keys.session_id)
    state = await redis.hget(keys.meta, "state")
    if state is not None and codec.text(state) == FORGOTTEN_STATE:
        found.marked.add(keys.session_id)
        return
    if receipt.dry_run:
        removed = int(await redis.exists(*keys.all()))
    else:
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        async with redis.pipeline(transaction=True) as pipe:
            for key in keys.all():
                pipe.unlink(key)
            pipe.hset(keys.meta, mapping={"state": FORGOTTEN_STATE, "forgotten_at": now})
            pipe.pexpire(keys.meta, ttl_ms)
            replies = await pipe.execute()
        removed = sum(int(r) for r in replies[: len(keys.all())])
    found.marked.add(keys.session_id)
    _add(receipt.redis, "working_memory_keys", removed)
    _add(receipt.redis, "sessions_marked", 1)


async def _mark_seen(
    redis: Redis, prefix: str, shards: int, receipt: ForgetReceipt, found: _Found, ttl_ms: int
) -> None:
    project = receipt.project_id
    seen = [
        SessionKeys(prefix, shard_of(project, s, shards), project, s)
        for s in sorted(found.sessions - found.marked)
    ]
    await _mark_all(redis, seen, receipt, found, ttl_ms)


async def _shard_count(redis: Redis, prefix: str) -> int:
    """The number of shards, as the streams under the prefix show it (at least 1)."""
    highest = 0
    async for raw in redis.scan_iter(
        match=f"{escape_glob(prefix)}:*", count=SCAN_COUNT, _type="stream"
    ):
        name = codec.text(raw)
        for kind in ("lifecycle", "results"):
            head = f"{prefix}:{kind}:{{"
            if name.startswith(head) and name.endswith("}") and name[len(head) : -1].isdigit():
                highest = max(highest, int(name[len(head) : -1]) + 1)
    return max(1, highest)


# -- 2: Postgres ---------------------------------------------------------------------------------


async def _forget_rows(
    engine: AsyncEngine, receipt: ForgetReceipt, found: _Found, redis_now: datetime | None
) -> None:
    project, session, before, user = (
        receipt.project_id,
        receipt.session_id,
        receipt.before,
        receipt.user_id,
    )
    async with engine.begin() as conn:
        await lock_project(conn, project)
        if user is not None:  # the user's sessions: their results go, their keys are marked
            found.sessions.update(await user_sessions(conn, project, session, before, user))
        episodes = row_scope(Episode, project, session, before, user)
        events = row_scope(LifecycleEvent, project, session, before, user, found.sessions)
        # After the lock: every row a writer committed before it is older than the cutoff.
        now: datetime = (await conn.execute(select(func.clock_timestamp()))).scalar_one()
        if redis_now is not None:
            now = max(now, redis_now)
        receipt.cutoff = min(now, before) if before is not None else now
        vectors = await _count_vectors(conn, episodes)
        if receipt.dry_run:
            found.sessions.update(
                s
                for s in await conn.scalars(
                    select(Episode.session_id).where(*episodes, Episode.turn_id.is_(None))
                )
            )
            found.sessions.update(
                s
                for s in await conn.scalars(select(LifecycleEvent.session_id).where(*events))
                if s is not None
            )
            n_episodes = await _count(conn, Episode, episodes)
            n_events = await _count(conn, LifecycleEvent, events)
        else:
            erasure = uuid.uuid4()
            receipt.erasure_id = str(erasure)
            await conn.execute(
                insert(Erasure).values(
                    id=erasure,
                    project_id=project,
                    session_id=session,
                    before=before,
                    cutoff=receipt.cutoff,
                    user_id=user,
                )
            )
            gone = (
                await conn.execute(
                    delete(Episode)
                    .where(*episodes)
                    .returning(Episode.session_id, Episode.turn_id, Episode.id)
                )
            ).all()
            n_episodes = len(gone)
            found.sessions.update(s for s, turn, _id in gone if turn is None)
            found.episode_ids.update(str(i) for _s, _turn, i in gone)
            gone_events = await conn.scalars(
                delete(LifecycleEvent).where(*events).returning(LifecycleEvent.session_id)
            )
            event_sessions = list(gone_events)
            n_events = len(event_sessions)
            found.sessions.update(s for s in event_sessions if s is not None)
        if user is not None and session is None:  # facts, blocks, the feed's outbox: a
            # user's, of no session (a session's forget leaves them, as LoomFlow's does)
            tables = await forget_user_tables(conn, project, user, before, dry_run=receipt.dry_run)
    receipt.postgres.update(
        episodes=n_episodes, lifecycle_events=n_events, episode_embeddings=vectors
    )
    if user is not None and session is None:
        receipt.postgres.update(tables)


async def _count(
    conn: AsyncConnection,
    model: type[Episode] | type[LifecycleEvent],
    where: list[ColumnElement[bool]],
) -> int:
    return int(
        (await conn.execute(select(func.count()).select_from(model).where(*where))).scalar_one()
    )


async def _count_vectors(conn: AsyncConnection, where: list[ColumnElement[bool]]) -> int:
    if not await has_vector_table(conn):
        return 0
    vectors = table(VECTOR_TABLE, column("episode_id", PG_UUID(as_uuid=True)))
    joined = vectors.join(Episode, Episode.id == vectors.c.episode_id)
    return int(
        (await conn.execute(select(func.count()).select_from(joined).where(*where))).scalar_one()
    )


async def _store_counts(engine: AsyncEngine, receipt: ForgetReceipt) -> None:
    if receipt.erasure_id is None:
        return
    async with engine.begin() as conn:
        await conn.execute(
            update(Erasure)
            .where(Erasure.id == uuid.UUID(receipt.erasure_id))
            .values(counts=receipt.counts())
        )


# -- 4: streams (``worker.erasure.streams``) ---------------------------------------------------


async def _scrub_streams(
    redis: Redis, prefix: str, receipt: ForgetReceipt, found: _Found, cutoff_ms: int
) -> None:
    scrubbed = await scrub_streams(
        redis,
        prefix,
        receipt.project_id,
        receipt.session_id,
        cutoff_ms,
        receipt.dry_run,
        None
        if receipt.user_id is None
        else UserScope(receipt.user_id, set(found.sessions), set(found.episode_ids)),
    )
    receipt.streams.update(scrubbed.removed)
    found.sessions.update(scrubbed.sessions)
    found.result_ids.update(scrubbed.result_ids)


# -- 5: counters and dedupe records --------------------------------------------------------------


async def _forget_counters(
    redis: Redis, prefix: str, receipt: ForgetReceipt, found: _Found
) -> None:
    project = escape_glob(receipt.project_id)
    p = escape_glob(prefix)
    if receipt.session_id is None:
        seq_pattern = f"{p}:{{*}}:seq:{project}/*"
    else:
        seq_pattern = f"{p}:{{*}}:seq:{project}/{escape_glob(receipt.session_id)}"
    seq_keys = [
        k
        async for k in redis.scan_iter(match=seq_pattern, count=SCAN_COUNT)
        if receipt.session_id is not None
        or codec.text(k).rpartition(":seq:")[2].partition("/")[0] == receipt.project_id
    ]
    if receipt.user_id is not None:  # the user's sessions' only
        seq_keys = [k for k in seq_keys if codec.text(k).rpartition("/")[2] in found.sessions]
    dedupe_keys = []
    async for k in redis.scan_iter(match=f"{p}:{{*}}:evt:{project}/*", count=SCAN_COUNT):
        if codec.text(k).rpartition(":evt:")[2].partition("/")[0] != receipt.project_id:
            continue
        if receipt.session_id is None and receipt.user_id is None:
            dedupe_keys.append(k)
        else:  # a refused command's record holds its result's id: ours if we deleted it
            value = await redis.get(k)
            if value is not None and codec.text(value) in found.result_ids:
                dedupe_keys.append(k)
    for name, keys in (("seq_keys", seq_keys), ("dedupe_keys", dedupe_keys)):
        if receipt.dry_run:
            _add(receipt.redis, name, len(keys))
            continue
        removed = 0
        for at in range(0, len(keys), DELETE_BATCH):
            pipe = redis.pipeline(transaction=False)
            for key in keys[at : at + DELETE_BATCH]:  # one key per UNLINK: fine on a cluster
                pipe.unlink(key)
            removed += sum(int(n) for n in await pipe.execute())
        _add(receipt.redis, name, removed)


# -- 6: the event --------------------------------------------------------------------------------


async def _announce(redis: Redis, prefix: str, receipt: ForgetReceipt) -> None:
    event = {
        "type": FORGOTTEN_EVENT,
        "event_id": receipt.erasure_id or str(uuid.uuid4()),
        "project_id": receipt.project_id,
        "session_id": receipt.session_id,
        "user_id": receipt.user_id,
        "before": receipt.before.isoformat() if receipt.before else None,
        "cutoff": receipt.cutoff.isoformat() if receipt.cutoff else None,
        "occurred_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "counts": receipt.counts(),
        "complete": receipt.ok,
    }
    await redis.xadd(episodes_stream(prefix), {"data": orjson.dumps(event)})


def _add(counts: dict[str, int], name: str, n: int) -> None:
    counts[name] = counts.get(name, 0) + n
