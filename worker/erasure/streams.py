"""Stream entries of a forgotten scope: found (``scope_entries``, for export) and deleted
(``scrub_streams``, for forget: ``worker.erasure.forget``).

Every stream under the prefix is read: commands, results, ``P:episodes``, every DLQ, and any
stream a replay published to. An entry is the scope's when its ``data`` (a dead letter: its
original entry's) names the project (and session), and, with ``before``, when its stream id is
older. Stream entries cannot be edited: each is acknowledged in every group of its stream and
deleted, in one MULTI, so no group keeps it pending; trimming (``MINID``) and replay ranges
(``XRANGE``) step over the gaps. ``memory.forgotten`` events and ``forgotten`` rejections name
the project with ids only, and are kept.

With a user (``worker.erasure.users``), an entry is the scope's when it is that user's
data: it carries the user (a spawn, every result of the user's sessions, the change feed's
events), or it is of one of the user's sessions (a session's later commands carry no user:
the sessions are found first, in Postgres, in live ``meta`` hashes and in these entries), or
it announces one of the user's deleted episodes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from redis.asyncio import Redis

from worker import codec
from worker.erasure.erased import entry_body, entry_ms, entry_scope, user_of
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


@dataclass(frozen=True, slots=True)
class UserScope:
    """A user's part of a scope: the user (``''``: no user), the user's sessions, and the ids
    of the user's deleted episodes (their announcements go too)."""

    user: str
    sessions: Collection[str] = ()
    episode_ids: Collection[str] = ()

    def owns(self, body: dict[str, Any], session: str | None) -> bool:
        owner = user_of(body)
        if owner is not None and owner == self.user:
            return True
        if session is not None and session in self.sessions:
            return True
        episode = body.get("episode_id")
        return isinstance(episode, str) and episode in self.episode_ids

    def starts_session(self, body: dict[str, Any]) -> bool:
        """An entry that says its session is the user's: a spawn, or a result (the change
        feed's events name a turn's session: the caller's, not one of ours)."""
        if self.user:
            session_entry = "causation_id" in body or body.get("type") == "spawn"
            return session_entry and user_of(body) == self.user
        return user_of(body) == "" and body.get("type") in ("spawn", "agent.spawned")


def _covers(
    project_id: str,
    session_id: str | None,
    cutoff_ms: int | None,
    entry_id: Any,
    fields: dict[Any, Any],
    user: UserScope | None = None,
    since_ms: int | None = None,
) -> bool:
    """Whether a forget of the scope deletes this entry: the scope's, and (when ``cutoff_ms``)
    added before the cutoff (a dead letter: its source entry was), and (when ``since_ms``) not
    before that."""
    if not _older(project_id, session_id, cutoff_ms, entry_id, fields):
        return False
    if since_ms is not None:
        source = fields.get(b"source_id", fields.get("source_id"))
        if entry_ms(source if source else entry_id) < since_ms:
            return False
    if user is not None:
        body = entry_body(fields)
        if not user.owns(body, entry_scope(fields)[1]):
            return False
    return not _kept(fields)


def _older(
    project_id: str,
    session_id: str | None,
    cutoff_ms: int | None,
    entry_id: Any,
    fields: dict[Any, Any],
) -> bool:
    """The entry names the project (and session), and is older than ``cutoff_ms`` if given."""
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
    return True


async def with_stream_sessions(
    redis: Redis,
    prefix: str,
    project_id: str,
    session_id: str | None,
    cutoff_ms: int | None,
    user: UserScope,
) -> UserScope:
    """``user`` with the sessions the streams say are the user's too (a first pass: a later
    command of a session carries no user, its spawn and results do)."""
    sessions = set(user.sessions)
    for stream in await _streams(redis, prefix):
        async for rows in _batches(redis, stream):
            for entry_id, fields in rows:
                if not _older(project_id, session_id, cutoff_ms, entry_id, fields):
                    continue
                session = entry_scope(fields)[1]
                if session is not None and user.starts_session(entry_body(fields)):
                    sessions.add(session)
    return UserScope(user.user, sessions, user.episode_ids)


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
    user: UserScope | None = None,
) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    """``(stream, entry id, fields)`` of every stream entry a forget of the scope deletes."""
    before_ms = _ms(before) if before is not None else None
    if user is not None:
        user = await with_stream_sessions(redis, prefix, project_id, session_id, before_ms, user)
    for stream in await _streams(redis, prefix):
        async for rows in _batches(redis, stream):
            for entry_id, fields in rows:
                if _covers(project_id, session_id, before_ms, entry_id, fields, user):
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
    user: UserScope | None = None,
    since_ms: int | None = None,
) -> Scrubbed:
    """Delete (XACK in every group, then XDEL, in one MULTI) every entry of every stream under
    the prefix that carries the scope and was added before ``cutoff_ms`` (the forget's
    cutoff: what comes later is a new session's, or a ``forgotten`` rejection)."""
    out = Scrubbed()
    if user is not None:
        user = await with_stream_sessions(redis, prefix, project_id, session_id, cutoff_ms, user)
        out.sessions.update(user.sessions)
    for stream in await _streams(redis, prefix):
        groups = [codec.text(g["name"]) for g in await redis.xinfo_groups(stream)]
        removed = 0
        async for rows in _batches(redis, stream):
            doomed = []
            for entry_id, fields in rows:
                if _covers(project_id, session_id, cutoff_ms, entry_id, fields, user, since_ms):
                    doomed.append(codec.text(entry_id))
                    session = entry_scope(fields)[1]
                    if session is not None and user is None:  # a user's: from the first pass
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
