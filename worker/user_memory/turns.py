"""Episodes of user memory: one per conversation turn, in the ``episodes`` table beside the
sessions' episodes, recalled together.

A turn's row has ``turn_id`` (LoomFlow's ``Episode.id``), ``input``, ``output``,
``tool_calls``, ``tool_transcript``; its uuid ``id`` is derived from ``(project, turn_id)`` and
its ``source_event_id`` is ``turn:<project>/<turn_id>``, so a session's episode and a turn never
collide. A session's episode reads as a LoomFlow ``Episode`` (``SessionEpisode``): its task as
``input``, its outcome and lessons as ``output``, its uuid as ``id``.

``remember`` is idempotent: the same id with the same content is one row (the first call's
``occurred_at`` stays); the same id with other content raises ``EpisodeConflictError`` and
changes nothing. A turn is findable by its words as soon as ``remember`` returns (the
``search_vector`` column is computed in the INSERT) and by meaning once the indexer has embedded
it (``episode.remembered`` then ``episode.recallable`` on the change feed).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import orjson
from pydantic import Field
from sqlalchemy import text
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from worker.db.models import EPISODE_NAMESPACE, TURN_OUTCOME
from worker.user_memory.models import Episode, Message, ToolCall, as_utc, check_user_id

TURN_SOURCE_PREFIX = "turn:"
MAX_TURN_ID = 256


class EpisodeConflictError(ValueError):
    """``remember`` of an id already stored with other content."""


class SessionEpisode(Episode):
    """A finished session's episode read as a LoomFlow ``Episode``, with what it has more."""

    agent_type_id: str | None = None
    outcome: str | None = None
    lessons_learned: list[str] = Field(default_factory=list)


def turn_uuid(project_id: str, turn_id: str) -> uuid.UUID:
    return uuid.uuid5(EPISODE_NAMESPACE, f"{TURN_SOURCE_PREFIX}{project_id}/{turn_id}")


EPISODE_COLUMNS = (
    "id, turn_id, session_id, user_id, occurred_at, input, output, tool_calls, tool_transcript,"
    " task_description, outcome, lessons_learned, agent_type_id"
)

_INSERT = text(
    "INSERT INTO episodes (id, source_event_id, project_id, session_id, user_id, turn_id, input,"
    " output, tool_calls, tool_transcript, outcome, lessons_learned, context_summary,"
    " importance_score, occurred_at) VALUES (:id, :src, :p, :s, :u, :t, :i, :o,"
    " CAST(:calls AS jsonb), CAST(:transcript AS jsonb), :outcome, '[]'::jsonb, '', 0.5, :at)"
    " ON CONFLICT DO NOTHING RETURNING id"
)
_STORED = text(
    f"SELECT {EPISODE_COLUMNS}, announced_at IS NULL AS owed FROM episodes"
    " WHERE project_id = :p AND turn_id = :t"
)


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def episode_from_row(row: Row[Any]) -> Episode:
    """A row of ``episodes`` (``EPISODE_COLUMNS``) as an ``Episode``."""
    if row.turn_id is not None:
        return Episode(
            id=row.turn_id,
            session_id=row.session_id,
            user_id=row.user_id,
            occurred_at=row.occurred_at,
            input=row.input or "",
            output=row.output or "",
            tool_calls=[ToolCall.model_validate(c) for c in row.tool_calls or []],
            tool_transcript=(
                None
                if row.tool_transcript is None
                else [Message.model_validate(m) for m in row.tool_transcript]
            ),
        )
    lessons = [str(x) for x in row.lessons_learned or []]
    output = row.outcome + (": " + "; ".join(lessons) if lessons else "")
    return SessionEpisode(
        id=str(row.id),
        session_id=row.session_id,
        user_id=row.user_id,
        occurred_at=row.occurred_at,
        input=row.task_description or "",
        output=output,
        agent_type_id=row.agent_type_id,
        outcome=row.outcome,
        lessons_learned=lessons,
    )


def _content(episode: Episode) -> dict[str, Any]:
    """What must agree for two ``remember`` calls of one id to be the same episode."""
    return {
        "session_id": episode.session_id,
        "user_id": episode.user_id,
        "input": episode.input,
        "output": episode.output,
        "tool_calls": [c.model_dump(mode="json") for c in episode.tool_calls],
        "tool_transcript": (
            None
            if episode.tool_transcript is None
            else [m.model_dump(mode="json") for m in episode.tool_transcript]
        ),
    }


async def insert_turn(
    conn: AsyncConnection, project_id: str, episode: Episode
) -> tuple[bool, bool]:
    """Insert the turn; ``(new, owed)``: new is False when that id was stored with the same
    content; owed, when its ``episode.recorded`` is not published yet (the outbox flag)."""
    if not isinstance(episode.id, str) or not 0 < len(episode.id) <= MAX_TURN_ID:
        raise ValueError(f"an episode id is 1-{MAX_TURN_ID} characters, not {episode.id!r:.80}")
    if not episode.session_id:
        raise ValueError("an episode needs a session_id")
    content = _content(episode)
    row_id = turn_uuid(project_id, episode.id)
    inserted = await conn.execute(
        _INSERT,
        {
            "id": row_id,
            "src": f"{TURN_SOURCE_PREFIX}{project_id}/{episode.id}",
            "p": project_id,
            "s": episode.session_id,
            "u": episode.user_id,
            "t": episode.id,
            "i": episode.input,
            "o": episode.output,
            "calls": _json(content["tool_calls"]),
            "transcript": _json(content["tool_transcript"]),
            "outcome": TURN_OUTCOME,
            "at": as_utc(episode.occurred_at),
        },
    )
    if inserted.first() is not None:
        return True, True
    stored = (await conn.execute(_STORED, {"p": project_id, "t": episode.id})).first()
    if stored is None:
        raise EpisodeConflictError(
            f"episode {episode.id!r}: its session {episode.session_id!r} already has a"
            " session episode of that id"
        )
    if _content(episode_from_row(stored)) != content:
        raise EpisodeConflictError(
            f"episode {episode.id!r} is already remembered with other content; an episode is"
            " immutable: remember the change under a new id"
        )
    return False, bool(stored.owed)


def partition(user_id: str | None, column: str = "user_id") -> str:
    """SQL: the ``user_id`` partition (None is its own bucket)."""
    check_user_id(user_id)
    return f"{column} IS NULL" if user_id is None else f"{column} = :u"


async def episodes_of(
    conn: AsyncConnection,
    project_id: str,
    user_id: str | None,
    *,
    session_id: str | None = None,
    before: datetime | None = None,
    newest_first: bool = False,
    limit: int | None = None,
) -> list[Episode]:
    where = ["project_id = :p", partition(user_id)]
    params: dict[str, Any] = {"p": project_id, "u": user_id}
    if session_id is not None:
        where.append("session_id = :s")
        params["s"] = session_id
    if before is not None:
        where.append("occurred_at < :before")
        params["before"] = as_utc(before)
    order = "occurred_at DESC, id DESC" if newest_first else "occurred_at, id"
    tail = ""
    if limit is not None:
        tail = " LIMIT :n"
        params["n"] = max(0, limit)
    statement = text(
        f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE {' AND '.join(where)} ORDER BY {order}{tail}"
    )
    return [episode_from_row(r) for r in await conn.execute(statement, params)]


def session_messages_of(episodes: list[Episode]) -> list[Message]:
    """``[USER input, tool transcript…, ASSISTANT output]`` per episode, oldest first."""
    out: list[Message] = []
    for episode in episodes:
        if episode.input:
            out.append(Message(role="user", content=episode.input))
        if episode.tool_transcript:
            out.extend(episode.tool_transcript)
        if episode.output:
            out.append(Message(role="assistant", content=episode.output))
    return out
