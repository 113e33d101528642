"""The Redis keys of a forget's sessions: working memory turned into markers, and the
publishers' ``seq`` counters and dedupe records (``worker.erasure.forget``, steps 1 and 5).

A session is marked in one MULTI (its keys share a slot): its working memory and checkpoints
go and its ``meta`` hash becomes a marker (``state: forgotten`` and when), kept for
``ttl_ms``; from then on the apply function rejects every command for it ``forgotten``.

The publishers' keys of a session are its ``seq`` counter (``P:{i}:seq:<project>/<session>``)
and its last publishes (the same name and ``/pub``: ``worker.lifecycle.client``). Each key
name is read whole (the prefix, the shard, then ``project/session`` with ``/pub`` or
nothing; no id holds ``/``): a forget removes the keys of its own sessions, all of them, and
never a key of a session that only ends like one of them.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime

from redis.asyncio import Redis

from worker import codec
from worker.erasure.receipt import ForgetReceipt, Found, add
from worker.erasure.users import live_user_sessions
from worker.keys import (
    FORGOTTEN_STATE,
    SessionKeys,
    escape_glob,
    shard_of,
    working_memory_key_re,
    working_memory_pattern,
)

SCAN_COUNT = 1_000
DELETE_BATCH = 500
MARK_CONCURRENCY = 32
"""Sessions marked at once (a MULTI each: their keys share a slot, sessions do not)."""


async def mark_live(
    redis: Redis,
    prefix: str,
    receipt: ForgetReceipt,
    found: Found,
    ttl_ms: int,
    started_before_ms: int | None = None,
) -> None:
    """Mark every session of the scope kept in Redis (a user's: whose ``meta`` names the
    user); with ``started_before_ms`` (finishing an owed forget), only those spawned before it:
    a session spawned after the forget's cutoff is new data."""
    if receipt.user_id is not None:  # the user's live sessions only: their meta names the user
        sessions = await live_user_sessions(
            redis, prefix, receipt.project_id, receipt.session_id, receipt.user_id
        )
    else:
        shard_re = working_memory_key_re(prefix, receipt.project_id, receipt.session_id)
        sessions = {}
        pattern = working_memory_pattern(prefix, receipt.project_id, receipt.session_id)
        async for raw in redis.scan_iter(match=pattern, count=SCAN_COUNT):
            key = codec.text(raw)
            if (match := shard_re.match(key)) is not None:
                shard = int(key[len(prefix) + 2 : key.index("}", len(prefix))])
                sessions.setdefault(match["session"], shard)
    keys = [
        SessionKeys(prefix, shard, receipt.project_id, s) for s, shard in sorted(sessions.items())
    ]
    if started_before_ms is not None:
        keys = [k for k in keys if await _started_before(redis, k, started_before_ms)]
    await mark_all(redis, keys, receipt, found, ttl_ms)


async def _started_before(redis: Redis, keys: SessionKeys, cutoff_ms: int) -> bool:
    started = await redis.hget(keys.meta, "started_ms")  # type: ignore[misc]
    return started is None or int(float(codec.text(started))) < cutoff_ms


async def mark_all(
    redis: Redis, sessions: list[SessionKeys], receipt: ForgetReceipt, found: Found, ttl_ms: int
) -> None:
    """``mark`` each session, ``MARK_CONCURRENCY`` at a time (each is its own MULTI)."""
    for at in range(0, len(sessions), MARK_CONCURRENCY):
        part = sessions[at : at + MARK_CONCURRENCY]
        await asyncio.gather(*(mark(redis, keys, receipt, found, ttl_ms) for keys in part))


async def mark(
    redis: Redis, keys: SessionKeys, receipt: ForgetReceipt, found: Found, ttl_ms: int
) -> None:
    """Working memory gone, ``meta`` a marker: one MULTI (the session's keys share a slot)."""
    found.sessions.add(keys.session_id)
    state = await redis.hget(keys.meta, "state")  # type: ignore[misc]
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
    add(receipt.redis, "working_memory_keys", removed)
    add(receipt.redis, "sessions_marked", 1)


async def mark_seen(
    redis: Redis, prefix: str, shards: int, receipt: ForgetReceipt, found: Found, ttl_ms: int
) -> None:
    """Mark the sessions seen only in Postgres or the streams. A user's forget leaves alone a
    session id another user spawned since (an id may be spawned again once its tombstone is
    gone): live or a tombstone, its ``meta`` names them (a tombstone keeps its spawn's user
    when it named one); otherwise the latest life the streams (else Postgres) show names them
    (``found.holders``). Its working memory or
    tombstone, its counters and its later commands are theirs."""
    project = receipt.project_id
    seen = [
        SessionKeys(prefix, shard_of(project, s, shards), project, s)
        for s in sorted(found.sessions - found.marked)
    ]
    if receipt.user_id is not None:
        user = receipt.user_id
        others = [
            k
            for k in seen
            if found.holders.get(k.session_id, user) != user
            or await _live_for_another_user(redis, k, user)
        ]
        seen = [k for k in seen if k not in others]
        found.sessions.difference_update(k.session_id for k in others)
    await mark_all(redis, seen, receipt, found, ttl_ms)


async def _live_for_another_user(redis: Redis, keys: SessionKeys, user: str) -> bool:
    """The session is live and its spawn named another user (or none)."""
    state, owner = await redis.hmget(keys.meta, ["state", "user_id"])  # type: ignore[misc]
    if state is None or codec.text(state) == FORGOTTEN_STATE:
        return False  # gone, a tombstone (it keeps no user) or already forgotten
    if codec.text(state) == "terminated" and owner is None:
        return False  # a tombstone of no user (or an earlier version's): found.holders tells
    return (codec.text(owner) if owner is not None else "") != user


async def shard_count(redis: Redis, prefix: str) -> int:
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


def publisher_key_session(prefix: str, kind: str, key: str) -> tuple[str, str] | None:
    """``(project, session)`` of a publisher's key of ``kind`` read whole (``seq``: the counter
    or its ``/pub`` record; ``evt``: a dedupe record, ``(project, event id)``); None: not
    one."""
    match = re.fullmatch(
        rf"{re.escape(prefix)}:\{{\d+\}}:{kind}:(?P<project>[^/]+)/(?P<session>[^/]+)"
        + ("(?:/pub)?" if kind == "seq" else ""),
        key,
    )
    return None if match is None else (match["project"], match["session"])


async def forget_counters(redis: Redis, prefix: str, receipt: ForgetReceipt, found: Found) -> None:
    """Delete the scope's ``seq`` counters and ``/pub`` records (a user's: of the user's
    sessions only) and the dedupe records of the results it deleted (a project's: all)."""
    project = escape_glob(receipt.project_id)
    p = escape_glob(prefix)
    session = "*" if receipt.session_id is None else escape_glob(receipt.session_id)
    seq_keys = []
    async for raw in redis.scan_iter(match=f"{p}:{{*}}:seq:{project}/{session}*", count=SCAN_COUNT):
        owner = publisher_key_session(prefix, "seq", codec.text(raw))
        if owner is None or owner[0] != receipt.project_id:
            continue
        if receipt.session_id is not None and owner[1] != receipt.session_id:
            continue
        if receipt.user_id is not None and owner[1] not in found.sessions:
            continue  # another user's session
        seq_keys.append(raw)
    dedupe_keys = []
    async for raw in redis.scan_iter(match=f"{p}:{{*}}:evt:{project}/*", count=SCAN_COUNT):
        owner = publisher_key_session(prefix, "evt", codec.text(raw))
        if owner is None or owner[0] != receipt.project_id:
            continue
        if receipt.session_id is None and receipt.user_id is None:
            dedupe_keys.append(raw)
        else:  # a refused command's record holds its result's id: ours if we deleted it
            value = await redis.get(raw)
            if value is not None and codec.text(value) in found.result_ids:
                dedupe_keys.append(raw)
    for name, keys in (("seq_keys", seq_keys), ("dedupe_keys", dedupe_keys)):
        if receipt.dry_run:
            add(receipt.redis, name, len(keys))
            continue
        removed = 0
        for at in range(0, len(keys), DELETE_BATCH):
            pipe = redis.pipeline(transaction=False)
            for key in keys[at : at + DELETE_BATCH]:  # one key per UNLINK: fine on a cluster
                pipe.unlink(key)
            removed += sum(int(n) for n in await pipe.execute())
        add(receipt.redis, name, removed)
