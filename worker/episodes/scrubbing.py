"""Stream entries of a forgotten scope: found (``scope_entries``, for export) and deleted
(``scrub_streams``, for forget: ``worker.episodes.forgetting``).

Every stream under the prefix is read: commands, results, ``P:episodes``, every DLQ, and any
stream a replay published to. An entry is the scope's when its ``data`` (a dead letter: its
original entry's) names the project (and session), and, with ``before``, when its stream id is
older. Stream entries cannot be edited: each is acknowledged in every group of its stream and
deleted, in one MULTI, so no group keeps it pending; trimming (``MINID``) and replay ranges
(``XRANGE``) step over the gaps. ``memory.forgotten`` events and ``forgotten`` rejections name
the project with ids only, and are kept.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from redis.asyncio import Redis

from worker import codec
from worker.erased import entry_ms, entry_scope
from worker.keys import escape_glob

SCAN_COUNT = 1_000
XRANGE_BATCH = 1_000
DELETE_BATCH = 500
FORGOTTEN_EVENT = "memory.forgotten"
FORGOTTEN_REASON = "forgotten"


def _ms(instant: datetime) -> int:
    return int(instant.timestamp() * 1000)


def _kept(fields: dict[Any, Any]) -> bool:
    """Entries forget keeps though they name the project: ids only, by design."""
    try:
        body = codec.decode_entry(fields)
    except (codec.UnusableEntryError, ValueError):
        return False
    return body.get("type") == FORGOTTEN_EVENT or body.get("reason") == FORGOTTEN_REASON


def _covers(
    project_id: str,
    session_id: str | None,
    cutoff_ms: int | None,
    entry_id: Any,
    fields: dict[Any, Any],
) -> bool:
    """Whether a forget of the scope deletes this entry: the scope's, and (when ``cutoff_ms``)
    added before the cutoff (a dead letter: its source entry was)."""
    if project_id.encode() not in b"".join(
        v if isinstance(v, bytes) else str(v).encode() for v in fields.values()
    ):
        return False  # cheap: most entries are another project's
    project, session = entry_scope(fields)
    if project != project_id:
        return False
    if session_id is not None and session != session_id:
        return False
    if cutoff_ms is not None:
        source = fields.get(b"source_id", fields.get("source_id"))
        if entry_ms(source if source else entry_id) >= cutoff_ms:
            return False
    return not _kept(fields)


async def _streams(redis: Redis, prefix: str) -> list[str]:
    """Every stream under the prefix (commands, results, episodes, DLQs, replays' targets)."""
    return sorted(
        {
            codec.text(raw)
            async for raw in redis.scan_iter(
                match=f"{escape_glob(prefix)}:*", count=SCAN_COUNT, _type="stream"
            )
        }
    )


async def _batches(redis: Redis, stream: str) -> AsyncIterator[list[tuple[Any, Any]]]:
    low = "-"
    while True:
        rows: Any = await redis.xrange(stream, min=low, max="+", count=XRANGE_BATCH)
        if rows:
            yield rows
        if len(rows) < XRANGE_BATCH:
            return
        ms, _, seq = codec.text(rows[-1][0]).partition("-")
        low = f"{ms}-{int(seq) + 1}"


async def scope_entries(
    redis: Redis,
    prefix: str,
    project_id: str,
    session_id: str | None = None,
    before: datetime | None = None,
) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    """``(stream, entry id, fields)`` of every stream entry a forget of the scope deletes."""
    before_ms = _ms(before) if before is not None else None
    for stream in await _streams(redis, prefix):
        async for rows in _batches(redis, stream):
            for entry_id, fields in rows:
                if _covers(project_id, session_id, before_ms, entry_id, fields):
                    yield (
                        stream,
                        codec.text(entry_id),
                        {codec.text(k): v for k, v in fields.items()},
                    )


@dataclass(slots=True)
class Scrubbed:
    """What a scrub deleted (entries by stream), and the sessions and result ids it met."""

    removed: dict[str, int] = field(default_factory=dict)
    sessions: set[str] = field(default_factory=set)
    result_ids: set[str] = field(default_factory=set)


async def scrub_streams(
    redis: Redis,
    prefix: str,
    project_id: str,
    session_id: str | None,
    cutoff_ms: int,
    dry_run: bool = False,
) -> Scrubbed:
    """Delete (XACK in every group, then XDEL, in one MULTI) every entry of every stream under
    the prefix that carries the scope and was added before ``cutoff_ms`` (the forget's
    cutoff: what comes later is a new session's, or a ``forgotten`` rejection)."""
    out = Scrubbed()
    for stream in await _streams(redis, prefix):
        groups = [codec.text(g["name"]) for g in await redis.xinfo_groups(stream)]
        removed = 0
        async for rows in _batches(redis, stream):
            doomed = []
            for entry_id, fields in rows:
                if _covers(project_id, session_id, cutoff_ms, entry_id, fields):
                    doomed.append(codec.text(entry_id))
                    session = entry_scope(fields)[1]
                    if session is not None:
                        out.sessions.add(session)
            if not doomed:
                continue
            if ":results:" in stream:
                out.result_ids.update(doomed)
            removed += len(doomed) if dry_run else await _delete(redis, stream, groups, doomed)
        if removed:
            out.removed[stream] = removed
    return out


async def _delete(redis: Redis, stream: str, groups: Iterable[str], ids: list[str]) -> int:
    deleted = 0
    for at in range(0, len(ids), DELETE_BATCH):
        part = ids[at : at + DELETE_BATCH]
        async with redis.pipeline(transaction=True) as pipe:
            for group in groups:
                pipe.xack(stream, group, *part)
            pipe.xdel(stream, *part)
            replies = await pipe.execute()
        deleted += int(replies[-1])
    return deleted
