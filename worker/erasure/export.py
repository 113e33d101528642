"""Exporting a project (or one session of it, one user's data, its history before a time):
``export_project``, ``EpisodeStore.export`` and ``memworker export``.

It returns what ``worker.erasure.forget.forget_project`` with the same arguments would remove:
rows, working memory, and the stream entries that carry the scope. Every query filters on the
``project_id`` (the selector is checked whole first: ``worker.erasure.scope``): nothing here
can read another project's rows. Working-memory keys are matched with an escaped glob and then
each name is checked exactly (``worker.keys.working_memory_key_re``), so an id that contains
``:`` or a prefix that contains glob characters can never widen what is read.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from redis.asyncio import Redis
from sqlalchemy import ColumnElement, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from worker import codec
from worker.db.models import Episode, LifecycleEvent
from worker.db.vectors import VECTOR_TABLE, has_vector_table, parse_vector
from worker.erasure.lives import UserScope
from worker.erasure.scope import ForgetScope, row_scope
from worker.erasure.session_facts import export_session_facts
from worker.erasure.streams import scope_entries
from worker.erasure.users import (
    USER_TABLES,
    export_user_tables,
    live_user_sessions,
    user_sessions,
)
from worker.ids import validate_id
from worker.keys import FORGOTTEN_STATE, working_memory_key_re, working_memory_pattern

SCAN_COUNT = 1_000


@dataclass(slots=True)
class ProjectExport:
    """Everything memworker holds about a project (or one session of it)."""

    project_id: str
    session_id: str | None
    episodes: list[dict[str, Any]] = field(default_factory=list)
    lifecycle_events: list[dict[str, Any]] = field(default_factory=list)
    working_memory: dict[str, dict[str, Any]] = field(default_factory=dict)
    stream_entries: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    user_id: str | None = None
    """The user exported (``''``: the anonymous bucket); None: no user selector."""
    user_memory: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """With a user: the user's ``facts``, ``memory_blocks`` and ``memory_changes`` rows; with a
    session and no user: the ``facts`` made only from the session (``session_facts``); with
    neither: those three of the whole project."""

    def to_dict(self) -> dict[str, Any]:
        document = {
            "project_id": self.project_id,
            "session_id": self.session_id,
            "episodes": self.episodes,
            "lifecycle_events": self.lifecycle_events,
            "working_memory": self.working_memory,
            "stream_entries": self.stream_entries,
        }
        if self.user_id is not None:
            document = {"user_id": self.user_id, **document, **self.user_memory}
        elif self.session_id is not None:  # the facts made only from the session
            document["facts"] = self.user_memory.get("facts", [])
        else:  # the whole project: every user's facts, blocks and change-feed rows
            document.update(self.user_memory)
        return document


async def working_memory_keys(
    redis: Redis, prefix: str, project_id: str, session_id: str | None = None
) -> AsyncIterator[tuple[str, str, str]]:
    """``(key, session_id, kind)`` of every working-memory key of the project (or session)."""
    exact = working_memory_key_re(prefix, project_id, session_id)
    pattern = working_memory_pattern(prefix, project_id, session_id)
    async for raw in redis.scan_iter(match=pattern, count=SCAN_COUNT):
        key = codec.text(raw)
        if match := exact.match(key):
            yield key, match["session"], match["kind"]


def _json_ready(value: Any) -> Any:
    """Redis replies as JSON-friendly values: text when UTF-8, else ``{"base64": …}`` (a
    checkpoint's DUMP payloads are binary, and must come back byte for byte)."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(_json_ready(k)): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value


async def _read_key(redis: Redis, key: str) -> Any:
    kind = codec.text(await redis.type(key))
    if kind == "string":
        return _json_ready(await redis.get(key))
    if kind == "hash":
        return _json_ready(await redis.hgetall(key))  # type: ignore[misc]
    if kind == "list":
        return _json_ready(await redis.lrange(key, 0, -1))  # type: ignore[misc]
    if kind == "zset":
        scored: Any = await redis.zrange(key, 0, -1, withscores=True)
        return [[_json_ready(m), s] for m, s in scored]
    if kind == "set":
        return sorted(_json_ready(list(await redis.smembers(key))))  # type: ignore[misc]
    return None  # expired between SCAN and read


def _scope(
    model: type[Episode] | type[LifecycleEvent],
    project_id: str,
    session_id: str | None,
    before: datetime | None,
    user: str | None = None,
    sessions: Collection[str] = (),
) -> list[ColumnElement[bool]]:
    """The rows ``forget_project`` removes and ``export_project`` returns (ids validated
    before they reach SQL)."""
    validate_id(project_id, "project_id")
    if session_id is not None:
        validate_id(session_id, "session_id")
    return row_scope(model, project_id, session_id, before, user, sessions)


async def export_project(
    engine: AsyncEngine,
    project_id: str,
    *,
    session_id: str | None = None,
    before: datetime | None = None,
    redis: Redis | None = None,
    prefix: str | None = None,
    progress: Callable[[str, int], None] | None = None,
    user_id: str | None = None,
    anonymous_user: bool = False,
) -> ProjectExport:
    """Everything ``forget_project`` with the same arguments would remove, as JSON-ready data.
    ``progress(part, n)`` is told as each part grows (``memworker export``'s progress bar)."""
    tell = progress or (lambda _part, _n: None)
    checked = ForgetScope.checked(project_id, session_id, before, user_id, anonymous_user)
    user, before = checked.user, checked.before
    sessions: set[str] = set()
    live: dict[str, int] = {}
    export = ProjectExport(project_id, session_id, user_id=user)
    if user is not None:
        async with engine.connect() as conn:
            sessions = await user_sessions(conn, project_id, session_id, before, user)
            export.user_memory = await export_user_tables(conn, project_id, user, before)
        for part in USER_TABLES:
            tell(part, len(export.user_memory[part]))
        if redis is not None and prefix is not None:
            live = await live_user_sessions(redis, prefix, project_id, session_id, user)
            sessions.update(live)
    episode_query = select(Episode).where(*_scope(Episode, project_id, session_id, before, user))
    event_query = select(LifecycleEvent).where(
        *_scope(LifecycleEvent, project_id, session_id, before, user, sessions)
    )
    async with AsyncSession(engine, expire_on_commit=False) as session:
        episodes = await session.scalars(episode_query.order_by(Episode.occurred_at, Episode.id))
        export.episodes = [e.to_dict() for e in episodes]
        tell("episodes", len(export.episodes))
        events = await session.scalars(
            event_query.order_by(LifecycleEvent.occurred_at, LifecycleEvent.event_id)
        )
        export.lifecycle_events = [e.to_dict() for e in events]
        tell("results", len(export.lifecycle_events))
    if session_id is None and user is None:  # the whole project: every user's and none's
        async with engine.connect() as conn:
            export.user_memory = await export_user_tables(conn, project_id, None, before)
        for part in USER_TABLES:
            tell(part, len(export.user_memory[part]))
    if session_id is not None and user is None:
        async with engine.connect() as conn:
            ids = [e["id"] for e in export.episodes]
            export.user_memory["facts"] = await export_session_facts(conn, project_id, ids)
        tell("facts", len(export.user_memory["facts"]))
    await _attach_vectors(engine, export.episodes)
    if redis is None or prefix is None:
        return export
    if before is None:  # working memory is live state, never "older"
        async for key, key_session, kind in working_memory_keys(
            redis, prefix, project_id, session_id
        ):
            if user is not None and key_session not in live:
                continue  # another user's session
            value = await _read_key(redis, key)
            if kind == "meta" and isinstance(value, dict) and value.get("state") == FORGOTTEN_STATE:
                continue  # a forgotten session's marker: ids and a time, no memory
            if value is not None:
                export.working_memory.setdefault(key_session, {})[kind] = value
                tell("working memory keys", 1)
    scope = None
    if user is not None:
        scope = UserScope(user, sessions, {e["id"] for e in export.episodes})
    async for stream, entry in scope_entries(redis, prefix, project_id, session_id, before, scope):
        shown: dict[str, Any] = {
            "id": codec.text(entry.entry_id),
            "fields": _json_ready({codec.text(k): v for k, v in entry.fields.items()}),
        }
        if entry.pairs is not None:  # a name given twice: every pair, as Redis keeps them
            shown["pairs"] = _json_ready([[codec.text(k), v] for k, v in entry.pairs])
        export.stream_entries.setdefault(stream, []).append(shown)
        tell("stream entries", 1)
    return export


async def _attach_vectors(engine: AsyncEngine, episodes: list[dict[str, Any]]) -> None:
    """Each exported episode's vector (``embedding``: model, dimension, vector), if any."""
    if not episodes:
        return
    async with engine.connect() as conn:
        if not await has_vector_table(conn):
            return
        rows = await conn.execute(
            text(
                f"SELECT episode_id::text AS id, model, dimension, embedding::text AS vector"
                f" FROM {VECTOR_TABLE} WHERE episode_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": [e["id"] for e in episodes]},
        )
        vectors = {
            row.id: {
                "model": row.model,
                "dimension": row.dimension,
                "vector": parse_vector(row.vector),
            }
            for row in rows
        }
    for episode in episodes:
        episode["embedding"] = vectors.get(episode["id"])
