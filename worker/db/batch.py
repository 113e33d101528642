"""The consolidator's batched writes: one statement per batch, each column one array parameter.

Why it is shaped this way (bench/consolidation_throughput.py measures it):

- **Arrays and ``unnest``, not a multi-row ``VALUES``.** SQLAlchemy's multi-row insert binds
  every value on its own (17 columns × 500 rows of parameters, each through a bind processor),
  and that cost more Python time than everything else the consolidator does with a result.
  One ``text[]``/``uuid[]``/… parameter per column is encoded by asyncpg in C, and the statement
  text is the same for every batch, so it is prepared once.
- **JSON goes in as text.** The caller serialises each document once (orjson) and Postgres parses
  it into ``jsonb``; nothing re-encodes it on the way.
- **One statement for both tables**, one round trip; the episodes already there (a replay, a
  redelivery) are looked up only when there are some.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

EVENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "text"),
    ("type", "text"),
    ("project_id", "text"),
    ("session_id", "text"),
    ("agent_instance_id", "text"),
    ("causation_id", "text"),
    ("command", "text"),
    ("seq", "int8"),
    ("occurred_at", "timestamptz"),
    ("payload", "jsonb"),
)
"""``lifecycle_events`` columns the consolidator writes, in the order of its row tuples."""

EPISODE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "uuid"),
    ("source_event_id", "text"),
    ("project_id", "text"),
    ("session_id", "text"),
    ("agent_instance_id", "text"),
    ("agent_type_id", "text"),
    ("task_description", "text"),
    ("outcome", "text"),
    ("lessons_learned", "jsonb"),
    ("context_summary", "text"),
    ("snapshot", "jsonb"),
    ("tokens_used", "int8"),
    ("importance_score", "float8"),
    ("duration_seconds", "float8"),
    ("started_at", "timestamptz"),
    ("occurred_at", "timestamptz"),
    ("user_id", "text"),
    ("life", "text"),
)
"""``episodes`` columns the consolidator writes, in the order of its row tuples."""

EpisodeKey = tuple[uuid.UUID, str, str, str]
"""``(id, project_id, session_id, source_event_id)`` of an episode owed an announcement."""


def _insert(table: str, columns: Sequence[tuple[str, str]], first: int) -> str:
    names = ", ".join(name for name, _type in columns)
    arrays = ", ".join(
        f"${first + i}::{'text' if kind == 'jsonb' else kind}[]"
        for i, (_name, kind) in enumerate(columns)
    )
    values = ", ".join(f"{name}::jsonb" if kind == "jsonb" else name for name, kind in columns)
    return (
        f"INSERT INTO {table} ({names}) SELECT {values} FROM unnest({arrays}) AS row_({names})"
        " ON CONFLICT DO NOTHING"
    )


_EPISODE_KEY = "id, project_id, session_id, source_event_id"

INSERT_EVENTS = _insert("lifecycle_events", EVENT_COLUMNS, 1)
"""Append results to ``lifecycle_events``; a result already there is left alone."""

INSERT_EVENTS_AND_EPISODES = (
    f"WITH new_events AS ({INSERT_EVENTS})"
    f" {_insert('episodes', EPISODE_COLUMNS, len(EVENT_COLUMNS) + 1)} RETURNING {_EPISODE_KEY}"
)
"""Append results and insert episodes; return the episodes inserted."""

SELECT_UNANNOUNCED = (
    f"SELECT {_EPISODE_KEY} FROM episodes"
    " WHERE source_event_id = ANY($1::text[]) AND announced_at IS NULL"
)
"""Of episodes that were there already, the ones a crash left unannounced."""

SELECT_OWED = (
    f"SELECT {_EPISODE_KEY} FROM episodes"
    " WHERE announced_at IS NULL AND recorded_at <= now() - make_interval(secs => $1)"
    " ORDER BY recorded_at LIMIT $2 FOR UPDATE SKIP LOCKED"
)
"""The oldest episodes still owed an announcement, recorded at least ``$1`` s ago, locked for
this transaction (another relay skips them). Without an index on ``announced_at`` (one would
make the outbox UPDATE a non-HOT update): a scan, run only at start, after a refused
announcement and every ``relay_sweep_interval_s``."""

MARK_ANNOUNCED = "UPDATE episodes SET announced_at = now() WHERE id = ANY($1::uuid[])"


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[Any]:
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


async def insert_batch(
    conn: AsyncConnection,
    events: Sequence[tuple[Any, ...]],
    episodes: Sequence[tuple[Any, ...]],
) -> list[EpisodeKey]:
    """Insert ``events`` (``EVENT_COLUMNS`` tuples) and ``episodes`` (``EPISODE_COLUMNS``
    tuples), skipping rows already there; return the episodes owed an ``episode.recorded``:
    the new ones, and those already there but never announced (replayed, or redelivered after
    a crash between COMMIT and XADD). Looking for the latter costs a statement only when an
    episode was there already."""
    event_arrays = _columns(events, len(EVENT_COLUMNS))
    if not episodes:
        await conn.exec_driver_sql(INSERT_EVENTS, tuple(event_arrays))
        return []
    episode_arrays = _columns(episodes, len(EPISODE_COLUMNS))
    inserted = await conn.exec_driver_sql(
        INSERT_EVENTS_AND_EPISODES, (*event_arrays, *episode_arrays)
    )
    owed: list[EpisodeKey] = [
        (row.id, row.project_id, row.session_id, row.source_event_id) for row in inserted
    ]
    if len(owed) < len(episodes):
        new = {key[3] for key in owed}
        there = [source for source in episode_arrays[1] if source not in new]
        unannounced = await conn.exec_driver_sql(SELECT_UNANNOUNCED, (there,))
        owed += [
            (row.id, row.project_id, row.session_id, row.source_event_id) for row in unannounced
        ]
    return owed


async def owed_announcements(
    conn: AsyncConnection, older_than_s: float, limit: int
) -> list[EpisodeKey]:
    """Up to ``limit`` episodes owed an ``episode.recorded`` (oldest first), locked until the
    transaction ends (see ``SELECT_OWED``)."""
    rows = await conn.exec_driver_sql(SELECT_OWED, (float(older_than_s), limit))
    return [(row.id, row.project_id, row.session_id, row.source_event_id) for row in rows]


async def mark_announced(conn: AsyncConnection, episode_ids: Sequence[uuid.UUID]) -> None:
    """The outbox flag: these episodes' ``episode.recorded`` events are published."""
    await conn.exec_driver_sql(MARK_ANNOUNCED, (list(episode_ids),))
