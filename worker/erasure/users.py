"""A user's part of a forget (``memworker forget --user``): ``worker.erasure.forget``.

A user's data in a project: the episodes of the sessions whose spawn named the user and the
user's turns (``episodes.user_id``), the results of those sessions (``lifecycle_events``: each
result carries the session's ``user_id``), facts (``facts.user_id``), pinned blocks
(``memory_blocks.user_key``), the change feed's outbox rows (``memory_changes.payload``), the
working memory of the user's live sessions (their ``meta`` hash holds the spawn's
``user_id``), and the stream entries that carry any of it (``worker.erasure.streams``).

The user ``''`` is the anonymous bucket: data of no user (``user_id`` null); named users' ids
are never empty (``worker.ids.validate_id``). A session's own erasure and a project's are not
touched here: ``user`` None means "no user selector".
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy import ColumnElement, and_, false, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import aliased

from worker import codec
from worker.db.models import Episode, LifecycleEvent
from worker.keys import FORGOTTEN_STATE, working_memory_key_re, working_memory_pattern

SCAN_COUNT = 1_000
USER_TABLES = ("facts", "memory_blocks", "memory_changes")
"""The user-memory tables a user's forget clears (beside episodes and results)."""


def episode_user(user: str) -> ColumnElement[bool]:
    """SQL: an episode (a session's or a turn) of ``user`` (``''``: of no user)."""
    return Episode.user_id.is_(None) if user == "" else Episode.user_id == user


def _life_user(later: bool) -> ColumnElement[str | None]:
    """SQL: the user (``''``: none) of the spawn of a result's session that started its life:
    the latest ``agent.spawned`` of the session at or before the result (``later``: the first
    after it)."""
    spawn = aliased(LifecycleEvent)
    when = (
        spawn.occurred_at > LifecycleEvent.occurred_at
        if later
        else spawn.occurred_at <= LifecycleEvent.occurred_at
    )
    return (
        select(func.coalesce(spawn.payload["user_id"].astext, ""))
        .where(
            spawn.project_id == LifecycleEvent.project_id,
            spawn.session_id == LifecycleEvent.session_id,
            spawn.type == "agent.spawned",
            when,
        )
        .order_by(spawn.occurred_at.asc() if later else spawn.occurred_at.desc())
        .limit(1)
        .correlate(LifecycleEvent)
        .scalar_subquery()
    )


def event_user(user: str, sessions: Collection[str]) -> ColumnElement[bool]:
    """SQL: a result of ``user``. A result that names a user (every result applied to a
    session whose spawn named one) is that user's only. One that names none (a rejection, a
    session of no user) is of the life of its session it belongs to: the user of the latest
    ``agent.spawned`` of the session before it (none: the first after it); when no spawn of
    the session is kept, of ``user`` if it is one of the user's ``sessions`` (the anonymous
    bucket: always). A session id spawned again for another user keeps that user's results."""
    named = LifecycleEvent.payload["user_id"].astext
    no_user = func.coalesce(named, "") == ""
    life = func.coalesce(_life_user(later=False), _life_user(later=True))
    if user == "":
        return and_(no_user, func.coalesce(life, "") == "")
    of_session = LifecycleEvent.session_id.in_(sorted(sessions)) if sessions else false()
    return or_(named == user, and_(no_user, of_session, func.coalesce(life, user) == user))


async def session_holders(
    conn: AsyncConnection, project_id: str, sessions: Collection[str]
) -> dict[str, str]:
    """The user (``''``: none) of each session id's latest ``agent.spawned`` Postgres keeps."""
    if not sessions:
        return {}
    rows = await conn.execute(
        text(
            "SELECT DISTINCT ON (session_id) session_id, coalesce(payload->>'user_id', '')"
            " FROM lifecycle_events WHERE project_id = :p AND type = 'agent.spawned'"
            " AND session_id = ANY(:s) ORDER BY session_id, occurred_at DESC"
        ),
        {"p": project_id, "s": sorted(sessions)},
    )
    return {r[0]: r[1] for r in rows}


async def user_sessions(
    conn: AsyncConnection,
    project_id: str,
    session_id: str | None,
    before: datetime | None,
    user: str,
    since: datetime | None = None,
) -> set[str]:
    """The sessions of ``user`` Postgres knows: of its session episodes (not turns: a turn's
    session id is the caller's own) and of the results that carry the user."""
    where = "project_id = :p AND turn_id IS NULL AND " + (
        "user_id IS NULL" if user == "" else "user_id = :u"
    )
    params: dict[str, Any] = {"p": project_id, "u": user, "s": session_id, "b": before}
    params["a"] = since
    if session_id is not None:
        where += " AND session_id = :s"
    if before is not None:
        where += " AND occurred_at < :b"
    if since is not None:
        where += " AND occurred_at >= :a"
    found = {
        r[0]
        for r in await conn.execute(text(f"SELECT session_id FROM episodes WHERE {where}"), params)
    }
    events = "project_id = :p AND session_id IS NOT NULL AND " + (
        "NOT (payload ? 'user_id') AND type = 'agent.spawned'"
        if user == ""
        else "payload->>'user_id' = :u"
    )
    if session_id is not None:
        events += " AND session_id = :s"
    if before is not None:
        events += " AND occurred_at < :b"
    if since is not None:
        events += " AND occurred_at >= :a"
    rows = await conn.execute(
        text(f"SELECT DISTINCT session_id FROM lifecycle_events WHERE {events}"), params
    )
    found.update(r[0] for r in rows)
    return found


def _user_tables_where(
    user: str | None,
    before: datetime | None,
    since: datetime | None = None,
    *,
    written: bool = False,
    feed: bool | None = None,
) -> dict[str, str]:
    """``user``: ``''`` the anonymous bucket; None every user of the project (a whole-project
    forget or export). Facts in the range (``:b``, ``:a``) of their own time (``recorded_at``,
    the caller's); with ``written``, only those written before ``:w`` (``written_at``, the
    server's clock). A block by the time its text spans, ``content_since`` (when its oldest text
    was written: an append keeps it) to ``updated_at``: one holding text from before ``:w`` and
    ``:b`` (an append after the forget does not carry the old text out), last written at or
    after ``:a``; the whole block goes. The feed's
    outbox rows by their event's ``occurred_at``: before ``:f`` when ``feed`` (None: when
    ``before`` is given; ``:f`` is then ``before``)."""
    anonymous = user == ""
    if user is None:
        facts = blocks = changes = "project_id = :p"
    else:
        facts = "project_id = :p AND " + ("user_id IS NULL" if anonymous else "user_id = :u")
        blocks = "project_id = :p AND user_key = :u"
        changes = "project_id = :p AND " + (
            "coalesce(payload->>'user_id', '') = ''" if anonymous else "payload->>'user_id' = :u"
        )
    if written:
        facts += " AND written_at < :w"
        blocks += " AND content_since < :w"
    if before is not None:
        facts += " AND recorded_at < :b"
        blocks += " AND content_since < :b"
    if since is not None:
        facts += " AND recorded_at >= :a"
        blocks += " AND updated_at >= :a"
        changes += " AND (payload->>'occurred_at')::timestamptz >= :a"
    if feed or (feed is None and before is not None):
        changes += " AND (payload->>'occurred_at')::timestamptz < :f"
    return {"facts": facts, "memory_blocks": blocks, "memory_changes": changes}


async def forget_user_tables(
    conn: AsyncConnection,
    project_id: str,
    user: str | None,
    before: datetime | None,
    *,
    dry_run: bool,
    since: datetime | None = None,
    written_before: datetime | None = None,
    feed_before: datetime | None = None,
) -> dict[str, int]:
    """Delete (count, when ``dry_run``) the user's facts, blocks and outbox rows (``user``
    None: every user's of the project): facts and blocks written before ``written_before``
    (None: whenever) in the range ``[since, before)`` of their time; outbox rows whose event
    occurred before ``feed_before`` (None: ``before``)."""
    feed = before if feed_before is None else feed_before
    params = {"p": project_id, "u": user, "b": before, "a": since, "w": written_before, "f": feed}
    counts = {}
    where_of = _user_tables_where(
        user, before, since, written=written_before is not None, feed=feed is not None
    )
    for table, where in where_of.items():
        if dry_run:
            statement = f"SELECT count(*) FROM {table} WHERE {where}"
            counts[table] = int((await conn.execute(text(statement), params)).scalar_one())
        else:
            statement = f"DELETE FROM {table} WHERE {where} RETURNING 1"
            counts[table] = len((await conn.execute(text(statement), params)).all())
    return counts


async def export_user_tables(
    conn: AsyncConnection, project_id: str, user: str | None, before: datetime | None
) -> dict[str, list[dict[str, Any]]]:
    """The rows ``forget_user_tables`` would delete, as JSON-ready objects."""
    params = {"p": project_id, "u": user, "b": before, "f": before}
    out: dict[str, list[dict[str, Any]]] = {}
    for table, where in _user_tables_where(user, before).items():
        statement = f"SELECT row_to_json(x)::text FROM {table} x WHERE {where}"
        if table == "facts":  # its search vector is derived, not data
            statement = f"SELECT (to_jsonb(x) - 'search_vector')::text FROM {table} x WHERE {where}"
        out[table] = [orjson.loads(r[0]) for r in await conn.execute(text(statement), params)]
    return out


async def live_user_sessions(
    redis: Redis, prefix: str, project_id: str, session_id: str | None, user: str
) -> dict[str, int]:
    """Session → shard of each session of the project (or the one session) kept in Redis whose
    ``meta`` names ``user`` (``''``: a live session whose spawn named none). A tombstone keeps
    its spawn's ``user_id`` when it named one; one without it (no user, or written by an
    earlier version, which kept no user) is never taken for the anonymous bucket's here: a
    finished session of no user is found through Postgres or the streams."""
    exact = working_memory_key_re(prefix, project_id, session_id)
    found: dict[str, int] = {}
    pattern = working_memory_pattern(prefix, project_id, session_id)
    async for raw in redis.scan_iter(match=pattern, count=SCAN_COUNT):
        key = codec.text(raw)
        match = exact.match(key)
        if match is None or match["kind"] != "meta":
            continue
        state, owner = await redis.hmget(key, ["state", "user_id"])  # type: ignore[misc]
        if state is None or codec.text(state) == FORGOTTEN_STATE:
            continue
        if owner is None and codec.text(state) == "terminated":
            continue  # whose it was: Postgres and the streams say (above)
        if (codec.text(owner) if owner is not None else "") == user:
            found[match["session"]] = int(key[len(prefix) + 2 : key.index("}", len(prefix))])
    return found
