"""Episodes of user memory: one per conversation turn, in the ``episodes`` table beside the
sessions' episodes, recalled together.

A turn's row has ``turn_id`` (LoomFlow's ``Episode.id``), ``input``, ``output``,
``tool_calls``, ``tool_transcript``. A turn's id is unique per (project, user), the anonymous
bucket being one user: two users may each hold ``turn-1``, and neither learns of the other's.
Its uuid ``id`` is derived from ``(project, user, turn_id)`` and its ``source_event_id`` is
``turn:<project>@<user>/<turn_id>`` (``turn_source``), so a session's episode and a turn never
collide; a turn stored before migration 0007 keeps the ones it had
(``turn:<project>/<turn_id>``), so a turn is found by its columns (``project_id``,
``user_id``, ``turn_id``), never by deriving its uuid. A session's episode reads as a LoomFlow
``Episode`` (``SessionEpisode``): its task as ``input``, its outcome and lessons as
``output``, its uuid as ``id``.

``insert_pairs`` stores a batch of turns, of one project or several, in one statement: the new
turns and their owed change events (the outbox, ``worker.episodes.changes``) in batch order
(``insert_turns``: one project's); a batch with a conflicting id changes nothing (its
transaction is rolled back).

``remember`` is idempotent: the same id with the same content is one row (the first call's
``occurred_at`` stays); the same id with other content raises ``EpisodeConflictError`` and
changes nothing. A turn is findable by its words as soon as ``remember`` returns (the
``search_vector`` column is computed in the INSERT) and by meaning once the indexer has embedded
it (``episode.remembered`` then ``episode.recallable`` on the change feed).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

import orjson
from pydantic import Field
from sqlalchemy import text
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from schemas.inputs import stored_when
from worker.db.models import EPISODE_NAMESPACE, TURN_OUTCOME
from worker.ids import uuid5
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


def turn_source(project_id: str, user_id: str | None, turn_id: str) -> str:
    """A new turn's ``source_event_id``: ``turn:<project>@<user>/<turn_id>`` (no user: an
    empty one). Unambiguous: a project or user id holds neither ``@`` nor ``/`` (the id rule),
    and a user id is never empty; never one a turn stored before 0007 has
    (``turn:<project>/<turn_id>``), so a new turn never collides with an old one, whoever's."""
    return f"{TURN_SOURCE_PREFIX}{project_id}@{user_id or ''}/{turn_id}"


def turn_uuid(project_id: str, user_id: str | None, turn_id: str) -> uuid.UUID:
    """A new turn's row id (an old turn keeps its own: look a turn up by its columns)."""
    return uuid5(EPISODE_NAMESPACE, turn_source(project_id, user_id, turn_id))


def turn_key(episode: Episode) -> tuple[str | None, str]:
    """What names a turn within a project: its user and its id."""
    return episode.user_id, episode.id


EPISODE_COLUMNS = (
    "id, turn_id, session_id, user_id, occurred_at, input, output, tool_calls, tool_transcript,"
    " task_description, outcome, lessons_learned, agent_type_id"
)

_INSERT_MANY = text(
    "WITH r AS (SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:srcs AS text[]),"
    " CAST(:ps AS text[]), CAST(:ss AS text[]), CAST(:us AS text[]), CAST(:ts AS text[]),"
    " CAST(:is AS text[]), CAST(:os AS text[]), CAST(:calls AS text[]),"
    " CAST(:transcripts AS text[]), CAST(:ats AS timestamptz[]), CAST(:events AS text[]))"
    " WITH ORDINALITY AS r(id, src, p, s, u, t, i, o, calls, transcript, at, event, n)),"
    " ins AS (INSERT INTO episodes (id, source_event_id, project_id, session_id, user_id, turn_id,"
    " input, output, tool_calls, tool_transcript, outcome, lessons_learned, context_summary,"
    " importance_score, occurred_at) SELECT id, src, p, s, u, t, i, o, CAST(calls AS jsonb),"
    " CAST(transcript AS jsonb), :outcome, '[]'::jsonb, '', 0.5, at FROM r ORDER BY n"
    " ON CONFLICT DO NOTHING RETURNING id),"
    " owed AS (INSERT INTO memory_changes (project_id, payload)"
    " SELECT r.p, CAST(r.event AS jsonb) FROM r JOIN ins USING (id) ORDER BY r.n RETURNING seq)"
    " SELECT CASE WHEN count(*) = (SELECT count(*) FROM r) THEN NULL"
    " ELSE coalesce(array_agg(id), '{}') END AS new FROM ins"
)
"""The batch's new turns, each of its own project, and for each its change event, in batch
order (``seq`` follows ``n``: the outbox order, so each project's events in the batch's order
of its turns), in one round trip. One row back: NULL when every turn is new (a bulk import's
every batch: no row a turn to read), else the ids of the new ones."""
_STORED_MANY = text(
    f"SELECT {EPISODE_COLUMNS}, project_id, source_event_id, announced_at IS NULL AS owed"
    " FROM episodes JOIN unnest(CAST(:ps AS text[]), CAST(:us AS text[]), CAST(:ts AS text[]))"
    " AS k(p, u, t) ON project_id = k.p AND turn_id = k.t AND user_id IS NOT DISTINCT FROM k.u"
)
"""The stored turns of these ``(project, user, id)`` triples (each user's own of each project:
never another's)."""


def _json(models: list[ToolCall] | list[Message] | None) -> str | None:
    """Tool calls or a transcript as JSON text (``_content``'s), straight from the models."""
    if models is None:
        return None
    if not models:
        return "[]"
    return orjson.dumps([m.model_dump(mode="json") for m in models]).decode()


def episode_from_row(row: Row[Any]) -> Episode:
    """A row of ``episodes`` (``EPISODE_COLUMNS``) as an ``Episode``."""
    if row.turn_id is not None:
        return Episode(
            id=row.turn_id,
            session_id=row.session_id,
            user_id=row.user_id,
            occurred_at=stored_when(row.occurred_at),
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
        occurred_at=stored_when(row.occurred_at),
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


def same_content(a: Episode, b: Episode) -> bool:
    """Whether two turns of one id are the same episode (what ``remember`` compares)."""
    return _content(a) == _content(b)


class Kept(NamedTuple):
    """A turn ``insert_turns`` stored or found stored: whether it is new, whether its
    ``episode.recorded`` is owed (not published yet), and its row's id and source."""

    new: bool
    owed: bool
    row_id: uuid.UUID
    source: str


Stored = Kept | EpisodeConflictError
"""What ``insert_turns`` says of a turn: ``Kept``, or why it was not stored."""


async def insert_turns(
    conn: AsyncConnection,
    project_id: str,
    episodes: list[Episode],
    events: list[dict[str, Any]],
    *,
    indexed: bool = True,
    tool_json: list[tuple[str, str | None]] | None = None,
) -> list[Stored]:
    """``insert_pairs`` of one project's turns (distinct ``turn_key``s)."""
    pairs = [(project_id, episode) for episode in episodes]
    return await insert_pairs(conn, pairs, events, indexed=indexed, tool_json=tool_json)


async def insert_pairs(
    conn: AsyncConnection,
    pairs: list[tuple[str, Episode]],
    events: list[dict[str, Any]],
    *,
    indexed: bool = True,
    tool_json: list[tuple[str, str | None]] | None = None,
) -> list[Stored]:
    """Insert the ``(project, turn)`` pairs (distinct ``(project, *turn_key)``s, checked) with
    ``events[k]`` owed for each new one, in one statement, whatever the projects; per pair its
    ``Kept``, or the ``EpisodeConflictError`` of a turn its user stored in its project with
    other content (naming its index ``episodes[k]`` when ``indexed``): the caller raises it
    (and rolls back) or hands it to that turn's caller alone, the others stored. Another
    user's or another project's turn of the same id is never a conflict. ``tool_json``: each
    turn's tool calls and transcript as JSON text when the caller has them
    (``inputs.checked_tool_json``'s), else encoded here."""
    episodes = [episode for _project, episode in pairs]
    sources = [turn_source(p, e.user_id, e.id) for p, e in pairs]
    ids = [uuid5(EPISODE_NAMESPACE, source) for source in sources]  # turn_uuid's
    if tool_json is None:
        tool_json = [(_json(e.tool_calls) or "[]", _json(e.tool_transcript)) for e in episodes]
    inserted = await conn.execute(
        _INSERT_MANY,
        {
            "ids": ids,
            "srcs": sources,
            "ps": [project_id for project_id, _episode in pairs],
            "ss": [e.session_id for e in episodes],
            "us": [e.user_id for e in episodes],
            "ts": [e.id for e in episodes],
            "is": [e.input for e in episodes],
            "os": [e.output for e in episodes],
            "calls": [calls for calls, _transcript in tool_json],
            "transcripts": [transcript for _calls, transcript in tool_json],
            "ats": [as_utc(e.occurred_at) for e in episodes],
            "events": [orjson.dumps(event).decode() for event in events],
            "outcome": TURN_OUTCOME,
        },
    )
    results: list[Stored] = [Kept(True, True, i, s) for i, s in zip(ids, sources, strict=True)]
    new_ids = inserted.scalar_one()
    if new_ids is None:  # every turn new
        return results
    new = set(new_ids)
    old = [k for k in range(len(episodes)) if ids[k] not in new]
    if not old:
        return results
    found = await conn.execute(
        _STORED_MANY,
        {
            "ps": [pairs[k][0] for k in old],
            "us": [episodes[k].user_id for k in old],
            "ts": [episodes[k].id for k in old],
        },
    )
    stored = {(row.project_id, row.user_id, row.turn_id): row for row in found}
    for k in old:
        episode, row = episodes[k], stored.get((pairs[k][0], *turn_key(episodes[k])))
        where = f"episodes[{k}]: " if indexed else ""
        if row is None:
            results[k] = EpisodeConflictError(
                f"{where}episode {episode.id!r}: its session {episode.session_id!r} already has"
                " a session episode of that id"
            )
        elif _content(episode_from_row(row)) != _content(episode):
            results[k] = EpisodeConflictError(
                f"{where}episode {episode.id!r} is already remembered with other content; an"
                " episode is immutable: remember the change under a new id"
            )
        else:
            results[k] = Kept(False, bool(row.owed), row.id, row.source_event_id)
    return results


def partition(user_id: str | None, column: str = "user_id") -> str:
    """SQL: the ``user_id`` partition (None is its own bucket)."""
    check_user_id(user_id)
    return f"{column} IS NULL" if user_id is None else f"{column} = :u"


async def episodes_of(
    conn: AsyncConnection, project_id: str, user_id: str | None, **filters: Any
) -> list[Episode]:
    """The user's episodes (``keyed_episodes_of`` without the row ids)."""
    found = await keyed_episodes_of(conn, project_id, user_id, **filters)
    return [episode for _row_id, episode in found]


async def keyed_episodes_of(
    conn: AsyncConnection,
    project_id: str,
    user_id: str | None,
    *,
    session_id: str | None = None,
    before: datetime | None = None,
    newest_first: bool = False,
    limit: int | None = None,
) -> list[tuple[str, Episode]]:
    """The user's episodes (of one session, older than ``before``; oldest first, or newest),
    each with its row's id (a turn's is not derivable: module doc)."""
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
    return [(str(r.id), episode_from_row(r)) for r in await conn.execute(statement, params)]


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


async def activity_of(
    conn: AsyncConnection, project_id: str, user_id: str | None
) -> tuple[int, datetime | None, list[str]]:
    """The user's turn count, newest turn's time and ten most recent distinct sessions
    (newest first): ``Memory.profile``'s."""
    where = f"project_id = :p AND {partition(user_id)}"
    params = {"p": project_id, "u": user_id}
    count, last_seen = (
        await conn.execute(
            text(f"SELECT count(*), max(occurred_at) FROM episodes WHERE {where}"), params
        )
    ).one()
    sessions = await conn.execute(
        text(
            f"SELECT session_id FROM episodes WHERE {where} GROUP BY session_id"
            " ORDER BY max(occurred_at) DESC, session_id LIMIT 10"
        ),
        params,
    )
    return int(count), last_seen, [r.session_id for r in sessions]
