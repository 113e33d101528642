"""Stream entries of a forgotten scope: found (``scope_entries``, for export) and deleted
(``scrub_streams``, for forget: ``worker.erasure.forget``).

Every stream under the prefix is read: commands, results, ``P:episodes``, every DLQ, and any
stream a replay published to, every field/value pair of each entry (``worker.erasure.readings``:
a name given twice is judged by each of its values). An entry is the scope's when its ``data``
(a dead letter, an entry of a DLQ stream: its original entry's; an entry without one, or whose
``data`` names no project: its bare fields) names the project (and session), and, with
``before``, when its stream id is older; a session's forget also takes the change feed's
events of the facts it deleted (``fact_ids``). Stream entries cannot be edited: each is
acknowledged in every group of its stream and deleted, in one MULTI, so no group keeps it
pending; trimming (``MINID``) and replay ranges (``XRANGE``) step over
the gaps. ``memory.forgotten`` events and ``forgotten`` rejections name the project with ids
only, and are kept.

With a user (``worker.erasure.users``), an entry is the scope's when it is that user's
data: it names the user (a spawn, every result of the user's sessions, the change feed's
events; an entry that names another user is never the user's), or it announces one of the
user's deleted episodes, or it names no user and is of a life of a session id the user's spawn
started (``Lives``: a session id may be spawned again for another user once its tombstone is
gone; only when no spawn of it is kept, of one of the user's sessions: found first, in
Postgres, in live ``meta`` hashes and in these entries). docs/contract.md, "Forgetting".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from redis.asyncio import Redis

from worker import codec
from worker.erasure.erased import added_ms, entry_body, entry_ms, entry_scope
from worker.erasure.lives import Lives, UserScope, life_position
from worker.erasure.readings import Entry, raw_batches
from worker.erasure.session_facts import FACT_EVENTS
from worker.keys import escape_glob, is_dlq_stream

SCAN_COUNT = 1_000
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
    at_ms: int,
    user: UserScope | None = None,
    since_ms: int | None = None,
    stream: str = "",
    fact_ids: Collection[str] = (),
    letter: bool = False,
) -> bool:
    """Whether a forget of the scope deletes this entry: the scope's, and (when ``cutoff_ms``)
    added before the cutoff (``at_ms``: ``AddedAt``), and (when ``since_ms``) not before that;
    or a change-feed event of one of ``fact_ids`` (facts the forget deleted) added before the
    cutoff. ``letter``: the entry is a dead letter (its stream is a DLQ)."""
    if fact_ids and _of_facts(project_id, fact_ids, cutoff_ms, at_ms, fields, letter):
        return True
    if not _older(project_id, session_id, cutoff_ms, at_ms, fields, letter):
        return False
    if since_ms is not None and at_ms < since_ms:
        return False
    if user is not None:
        body = entry_body(fields, dead_letter=letter)
        position = life_position(stream, entry_id, fields, letter)
        if not user.owns(body, entry_scope(fields, dead_letter=letter)[1], position):
            return False
    return not _kept(fields)


def _takes(
    project_id: str,
    session_id: str | None,
    cutoff_ms: int | None,
    entry: Entry,
    at_ms: int,
    user: UserScope | None = None,
    since_ms: int | None = None,
    stream: str = "",
    fact_ids: Collection[str] = (),
    letter: bool = False,
) -> bool:
    """``_covers`` of an entry read whole (``worker.erasure.readings``): of each of its
    readings when it gives a name more than once. A project's or session's forget takes it
    when any reading is the scope's; a user's, when every reading that names the project
    (and session) is the user's: an entry that names two users is no single user's."""
    args = (project_id, session_id, cutoff_ms, entry.entry_id)
    rest = (stream, fact_ids, letter)
    if len(entry.readings) == 1:
        return _covers(*args, entry.fields, at_ms, user, since_ms, *rest)
    if user is None:
        return any(_covers(*args, r, at_ms, None, since_ms, *rest) for r in entry.readings)
    naming = [r for r in entry.readings if _older(project_id, session_id, None, at_ms, r, letter)]
    return bool(naming) and all(_covers(*args, r, at_ms, user, since_ms, *rest) for r in naming)


def _of_facts(
    project_id: str,
    fact_ids: Collection[str],
    cutoff_ms: int | None,
    at_ms: int,
    fields: dict[Any, Any],
    letter: bool,
) -> bool:
    """A change-feed event (``fact.added``, ``fact.superseded``; a dead letter of one) of one
    of ``fact_ids`` in the project, added before the cutoff: a session's forget deleted the
    fact (``worker.erasure.session_facts``); its events name no session."""
    if cutoff_ms is not None and at_ms >= cutoff_ms:
        return False
    if project_id.encode() not in b"".join(
        v if isinstance(v, bytes) else str(v).encode() for v in fields.values()
    ):
        return False  # cheap: most entries are another project's (the feed's ids are plain)
    body = entry_body(fields, dead_letter=letter)
    fact = body.get("fact_id")
    return (
        body.get("project_id") == project_id
        and body.get("type") in FACT_EVENTS
        and isinstance(fact, str)
        and fact in fact_ids
    )


def _older(
    project_id: str,
    session_id: str | None,
    cutoff_ms: int | None,
    at_ms: int,
    fields: dict[Any, Any],
    letter: bool,
) -> bool:
    """The entry names the project (and session), and (when ``cutoff_ms``) was added before it
    (``at_ms``: ``AddedAt``). The project is matched as the worker reads it, from the parsed
    ``data``: the raw bytes only rule out an entry that holds neither the id nor a ``\\u``
    escape (``"\\u0065sc"`` is the project ``esc``)."""
    raw = b"".join(v if isinstance(v, bytes) else str(v).encode() for v in fields.values())
    if project_id.encode() not in raw and b"\\u" not in raw:
        return False  # cheap: most entries are another project's
    project, session = entry_scope(fields, dead_letter=letter)
    if project != project_id:
        return False
    if session_id is not None and session != session_id:
        return False
    return cutoff_ms is None or at_ms < cutoff_ms


@dataclass(slots=True)
class AddedAt:
    """When each entry of one stream was added, read in stream order, as far as ids can say:
    its id's millisecond (on a DLQ, ``letters``: a dead letter's source entry's, when its
    ``source_id`` is a stream id; an entry of any other stream is dated by its own id whatever
    fields it carries), unless that is later than the
    scan's start (``now_ms``, Redis's clock): an id given by hand in the future makes Redis give
    every later entry of the stream an id past it, so such an id says nothing of when its entry
    was added; it counts as added when the last entry before it with an id not in the future
    was (a lower bound; 0 when there is none). A forget never leaves an entry of its scope
    because a stream's ids ran ahead of the clock."""

    now_ms: int
    letters: bool
    last_ms: int = 0

    def __call__(self, entry_id: Any, fields: dict[Any, Any]) -> int:
        ms = entry_ms(entry_id)
        if ms <= self.now_ms:
            self.last_ms = ms
        else:
            ms = self.last_ms
        if self.letters:
            source_ms = added_ms(entry_id, fields, dead_letter=True)
            return source_ms if source_ms <= self.now_ms else ms
        return ms


async def redis_now_ms(redis: Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def with_stream_sessions(
    redis: Redis,
    prefix: str,
    project_id: str,
    session_id: str | None,
    cutoff_ms: int | None,
    user: UserScope,
    now_ms: int,
) -> UserScope:
    """``user`` with the sessions the streams say are the user's too (a first pass: a later
    command of a session carries no user, its spawn and results do) and the lives of the
    project's sessions (every entry of the scope, whatever its time: a life started before a
    ``since`` still owns its later entries)."""
    sessions = set(user.sessions)
    lives = Lives()
    for stream in await _streams(redis, prefix):
        letters = is_dlq_stream(prefix, stream)
        added_at = AddedAt(now_ms, letters)
        async for rows in raw_batches(redis, stream):
            for entry in rows:
                at_ms = added_at(entry.entry_id, entry.fields)
                for fields, body in _named(project_id, session_id, at_ms, entry, letters):
                    lives.see(stream, entry.entry_id, fields, body, letters)
                    if cutoff_ms is not None and at_ms >= cutoff_ms:
                        continue
                    session = body.get("session_id")
                    if isinstance(session, str) and user.starts_session(body):
                        sessions.add(session)
    return UserScope(user.user, sessions, user.episode_ids, lives)


def _named(
    project_id: str, session_id: str | None, at_ms: int, entry: Entry, letter: bool
) -> list[tuple[dict[Any, Any], dict[str, Any]]]:
    """``(fields, body)`` of each reading of the entry that names the project (and session),
    its body parsed once; when the readings name different users (or some none), each says
    ``UNKNOWN_USER``: it starts no session, nor a life, of any single user."""
    named = [
        (fields, entry_body(fields, dead_letter=letter))
        for fields in entry.readings
        if _older(project_id, session_id, None, at_ms, fields, letter)
    ]
    if len(named) > 1 and len({str(body.get("user_id")) for _, body in named}) > 1:
        named = [(fields, body | {"user_id": codec.UNKNOWN_USER}) for fields, body in named]
    return named


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


async def scope_entries(
    redis: Redis,
    prefix: str,
    project_id: str,
    session_id: str | None = None,
    before: datetime | None = None,
    user: UserScope | None = None,
) -> AsyncIterator[tuple[str, Entry]]:
    """``(stream, entry)`` of every stream entry a forget of the scope deletes."""
    before_ms = _ms(before) if before is not None else None
    now_ms = await redis_now_ms(redis)
    if user is not None:
        user = await with_stream_sessions(
            redis, prefix, project_id, session_id, before_ms, user, now_ms
        )
    for stream in await _streams(redis, prefix):
        letters = is_dlq_stream(prefix, stream)
        added_at = AddedAt(now_ms, letters)
        async for rows in raw_batches(redis, stream):
            for entry in rows:
                at_ms = added_at(entry.entry_id, entry.fields)
                if _takes(
                    project_id,
                    session_id,
                    before_ms,
                    entry,
                    at_ms,
                    user,
                    stream=stream,
                    letter=letters,
                ):
                    yield stream, entry


@dataclass(slots=True)
class Scrubbed:
    """What a scrub deleted (entries by stream), and the sessions and result ids it met; a
    user's: the user of each of the user's session ids' latest life the streams show."""

    removed: dict[str, int] = field(default_factory=dict)
    sessions: set[str] = field(default_factory=set)
    result_ids: set[str] = field(default_factory=set)
    holders: dict[str, str] = field(default_factory=dict)


async def scrub_streams(
    redis: Redis,
    prefix: str,
    project_id: str,
    session_id: str | None,
    cutoff_ms: int,
    dry_run: bool = False,
    user: UserScope | None = None,
    since_ms: int | None = None,
    fact_ids: Collection[str] = (),
) -> Scrubbed:
    """Delete (XACK in every group, then XDEL, in one MULTI) every entry of every stream under
    the prefix that carries the scope and was added before ``cutoff_ms`` (the forget's
    cutoff: what comes later is a new session's, or a ``forgotten`` rejection), and the
    change-feed events of ``fact_ids`` (the facts a session's forget deleted)."""
    out = Scrubbed()
    now_ms = await redis_now_ms(redis)
    if user is not None:
        user = await with_stream_sessions(
            redis, prefix, project_id, session_id, cutoff_ms, user, now_ms
        )
        out.sessions.update(user.sessions)
        for own in user.sessions:
            if (holder := user.lives.holder(own)) is not None:
                out.holders[own] = holder
    for stream in await _streams(redis, prefix):
        groups = [codec.text(g["name"]) for g in await redis.xinfo_groups(stream)]
        removed = 0
        letters = is_dlq_stream(prefix, stream)
        added_at = AddedAt(now_ms, letters)
        async for rows in raw_batches(redis, stream):
            doomed = []
            for entry in rows:
                at_ms = added_at(entry.entry_id, entry.fields)
                if _takes(
                    project_id,
                    session_id,
                    cutoff_ms,
                    entry,
                    at_ms,
                    user,
                    since_ms,
                    stream,
                    fact_ids,
                    letters,
                ):
                    doomed.append(codec.text(entry.entry_id))
                    if user is None:  # a user's: from the first pass
                        for fields in entry.readings:
                            met = entry_scope(fields, dead_letter=letters)[1]
                            if met is not None:
                                out.sessions.add(met)
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
