"""Read-only views for operators: stream statistics and one session's working memory."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from worker.keys import SessionKeys, StreamKeys, episodes_stream
from worker.settings import Settings
from worker.stream_ids import stream_ids


@dataclass(frozen=True, slots=True)
class GroupStats:
    stream: str
    length: int
    group: str | None
    lag: int | None
    pending: int
    oldest_pending_age_s: float | None
    consumers: int
    dead_consumers: list[str] = field(default_factory=list)
    """Idle at least the dead-after time and owning no pending entry: a process that is gone
    (consumer names are unique per process, so each restart leaves one); safe to delete."""
    stalled_consumers: list[str] = field(default_factory=list)
    """Idle as long but owning pending entries: gone too, but its entries are reclaimed by
    another consumer first (never deleted with them)."""
    removed_unread: bool = False
    """Entries were removed from the stream before this group read them: the stream's
    ``max-deleted-entry-id`` is above the group's last-delivered id (an ``XADD … MAXLEN`` or
    ``XTRIM`` by someone; memworker's own trims never remove what a group has not read).
    Seen until the group reads past the removed ids."""
    ahead_seconds: float | None = None
    """How far the stream's last id is ahead of the clock, when by more than a minute: an
    entry was given an explicit future id (``XADD key <ms>-<seq>``), and every auto id since
    has that time (``worker.lifecycle.future_ids``); None otherwise."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _id_ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


DEAD_AFTER_SECONDS = 300.0
"""A consumer idle this long is gone: a live one reads at least every few seconds (its
blocking read lasts at most a second), and pending entries are reclaimed after 30–60 s."""


async def stream_stats(
    redis: Redis, settings: Settings, dead_after_s: float = DEAD_AFTER_SECONDS
) -> list[GroupStats]:
    """Length, lag, pending, oldest pending age and consumers (and which of them are dead)
    of every stream and group."""
    names: list[str] = []
    for shard in range(settings.shards):
        streams = StreamKeys(settings.stream_prefix, shard)
        names += [streams.lifecycle, streams.results, streams.dlq]
    names.append(episodes_stream(settings.stream_prefix))
    now_ms = time.time() * 1000
    rows: list[GroupStats] = []
    for name in names:
        length = int(await redis.xlen(name))
        try:
            groups = await redis.xinfo_groups(name)
        except ResponseError:
            groups = []
        ids = await stream_ids(redis, name)
        ahead = None if ids is None else ids.ahead_seconds(now_ms)
        if not groups:
            rows.append(GroupStats(name, length, None, None, 0, None, 0, ahead_seconds=ahead))
            continue
        for group in groups:
            group_name = (
                group["name"].decode() if isinstance(group["name"], bytes) else group["name"]
            )
            pending = int(group["pending"])
            oldest = None
            if pending:
                summary = await redis.xpending(name, group_name)
                if summary["min"]:
                    oldest = max(0.0, (now_ms - _id_ms(summary["min"])) / 1000)
            lag = group.get("lag")
            dead, stalled = await idle_consumers(redis, name, group_name, dead_after_s)
            rows.append(
                GroupStats(
                    name,
                    length,
                    group_name,
                    int(lag) if lag is not None else None,
                    pending,
                    oldest,
                    int(group["consumers"]),
                    dead,
                    stalled,
                    removed_unread=ids is not None and ids.removed_unread(group),
                    ahead_seconds=ahead,
                )
            )
    return rows


async def idle_consumers(
    redis: Redis, stream: str, group: str, dead_after_s: float
) -> tuple[list[str], list[str]]:
    """Consumers idle at least ``dead_after_s``: (without pending entries, with some)."""
    dead: list[str] = []
    stalled: list[str] = []
    for consumer in await redis.xinfo_consumers(stream, group):
        name = consumer["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        if int(consumer["idle"]) >= dead_after_s * 1000:
            (stalled if int(consumer["pending"]) else dead).append(name)
    return dead, stalled


async def prune_dead_consumers(
    redis: Redis, settings: Settings, dead_after_s: float = DEAD_AFTER_SECONDS
) -> list[tuple[str, str, str]]:
    """Delete every dead consumer (see ``GroupStats.dead_consumers``); each is checked again
    and deleted in one script, so a consumer that came back or owns entries is kept.
    Returns the ``(stream, group, consumer)`` deleted."""
    from worker.scripts import script

    delete = script("delete_idle_consumer.lua")
    deleted: list[tuple[str, str, str]] = []
    for row in await stream_stats(redis, settings, dead_after_s):
        for consumer in row.dead_consumers:
            assert row.group is not None
            done = await delete(
                redis, [row.stream], [row.group, consumer, int(dead_after_s * 1000)]
            )
            if done:
                deleted.append((row.stream, row.group, consumer))
    return deleted


async def inspect_session(
    redis: Redis, settings: Settings, project_id: str, session_id: str
) -> dict[str, Any]:
    """A session's state, variables, task state, scratchpad and checkpoints, as stored."""
    keys = SessionKeys.for_session(settings.stream_prefix, settings.shards, project_id, session_id)
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(keys.meta)
    pipe.hgetall(keys.vars)
    pipe.get(keys.task)
    pipe.lrange(keys.scratch, 0, -1)
    pipe.zrange(keys.cps, 0, -1, withscores=True)
    pipe.hgetall(keys.cpdata)
    pipe.pttl(keys.meta)
    meta, variables, task, scratch, cps, cpdata, ttl = await pipe.execute()
    checkpoints = []  # each by ``checkpoint_id``, as results, ``tail`` and the parameters say
    for cp_id, _score in cps:
        info = cpdata.get(cp_id + b"|info")
        stored = orjson.loads(info) if info else {}
        checkpoints.append(
            {
                "checkpoint_id": cp_id.decode(),
                "description": stored.get("description", ""),
                "created_at": stored.get("created_at"),
                "items": stored.get("items"),
            }
        )
    checkpoints.sort(key=lambda c: c["created_at"] or "")  # oldest first, as list_checkpoints
    return {
        "project_id": project_id,
        "session_id": session_id,
        "shard": keys.shard,
        "exists": b"state" in meta or bool(variables),
        "meta": {k.decode(): v.decode() for k, v in meta.items() if not k.startswith(b"@")},
        "dedupe_records": sum(
            len(v) // 8 if k == b"@" else 1 for k, v in meta.items() if k.startswith(b"@")
        ),
        "ttl_seconds": None if ttl < 0 else ttl / 1000,
        "variables": {k.decode(): orjson.loads(v) for k, v in variables.items()},
        "task_state": orjson.loads(task) if task else None,
        "scratchpad": [orjson.loads(e) for e in scratch],
        "checkpoints": checkpoints,
    }
