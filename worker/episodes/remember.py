"""Remember directly: an episode written without a session's terminate (LoomFlow's ``remember``).

``remember`` inserts an episode whose id is derived from the caller's ``memory_id`` (within the
project), so calling it again with the same id and content changes nothing and returns the same
episode; the same id with other content raises ``RememberConflictError`` and changes nothing
(as ``Memory.remember`` of a turn does: an episode is immutable, never silently kept).
It then announces ``episode.recorded`` on ``P:episodes`` exactly as the consolidator does (the
same outbox flag, ``announced_at``: a crash between the INSERT and the XADD is repaired by the
next call with that id), so the indexer embeds it and ``EpisodeStore.recall`` finds it like any
consolidated episode.

Its ``session_id`` is ``remember:<memory_id>`` and its ``source_event_id``
``remember:<project>/<memory_id>``: neither can collide with a session's episode.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import get_args

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from schemas.commands import Outcome
from schemas.inputs import InvalidInputError, json_text_problem
from worker.db.batch import insert_batch, mark_announced
from worker.db.models import episode_id_for
from worker.episodes.announcements import Announcement
from worker.ids import validate_write_id
from worker.keys import episodes_stream

REMEMBERED_SESSION_PREFIX = "remember:"


_STORED = text(
    "SELECT task_description, outcome, lessons_learned, context_summary, importance_score,"
    " agent_instance_id, agent_type_id FROM episodes WHERE id = :id"
)


class RememberConflictError(ValueError):
    """``remember`` of an id already stored with other content."""


async def _check_stored(
    conn: AsyncConnection, episode_id: uuid.UUID, memory_id: str, row: tuple[object, ...]
) -> None:
    """Refuse when the episode of this id holds other content than ``row`` would write."""
    stored = (await conn.execute(_STORED, {"id": episode_id})).first()
    if stored is None:
        return
    wanted = (row[6], row[7], orjson.loads(str(row[8])), row[9], row[12], row[4], row[5])
    if tuple(stored) != wanted:
        raise RememberConflictError(
            f"episode {memory_id!r} is already remembered with other content; an episode is"
            " immutable: remember the change under a new id"
        )


@dataclass(frozen=True, slots=True)
class Remembered:
    episode_id: uuid.UUID
    announced: bool
    """True when this call published ``episode.recorded`` (a new episode, or one a crash left
    unannounced); False when the episode was there and announced already."""


async def remember(
    engine: AsyncEngine,
    redis: Redis | RedisCluster,
    prefix: str,
    project_id: str,
    memory_id: str,
    *,
    task_description: str,
    lessons_learned: Sequence[str] = (),
    outcome: str = "success",
    context_summary: str = "",
    importance: float = 0.5,
    agent_instance_id: str | None = None,
    agent_type_id: str | None = None,
    occurred_at: datetime | None = None,
) -> Remembered:
    """Store (once) and announce an episode; idempotent on ``(project_id, memory_id)`` for the
    same content, ``RememberConflictError`` for other content."""
    validate_write_id(project_id, "project_id")
    validate_write_id(memory_id, "memory_id")
    if outcome not in get_args(Outcome):
        raise ValueError(f"outcome must be one of {', '.join(get_args(Outcome))}, not {outcome!r}")
    if not 0.0 <= importance <= 1.0:
        raise ValueError(f"importance must be between 0 and 1, not {importance}")
    for name, value in (
        ("task_description", task_description),
        ("lessons_learned", list(lessons_learned)),
        ("context_summary", context_summary),
    ):  # a NUL or a lone surrogate: refused here, naming it, not by Postgres with its SQL
        if (bad := json_text_problem(value, name)) is not None:
            raise InvalidInputError(*bad)
    source_event_id = f"{REMEMBERED_SESSION_PREFIX}{project_id}/{memory_id}"
    episode_id = episode_id_for(source_event_id)
    when = occurred_at or datetime.now(UTC)
    row = (
        episode_id,
        source_event_id,
        project_id,
        f"{REMEMBERED_SESSION_PREFIX}{memory_id}",
        agent_instance_id,
        agent_type_id,
        task_description,
        outcome,
        orjson.dumps(list(lessons_learned)).decode(),
        context_summary,
        None,
        None,
        float(importance),
        None,
        None,
        when,
        None,  # user_id
        "",  # life: a remembered episode ends no session's life
    )
    async with engine.begin() as conn:
        owed = await insert_batch(conn, [], [row])
        await _check_stored(conn, episode_id, memory_id, row)
    if not owed:
        return Remembered(episode_id, announced=False)
    announcement = Announcement(*owed[0])
    await redis.execute_command("XADD", episodes_stream(prefix), "*", "data", announcement.wire())
    async with engine.begin() as conn:
        await mark_announced(conn, [announcement.episode_id])
    return Remembered(episode_id, announced=True)
