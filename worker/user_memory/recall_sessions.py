"""A recall's context: the sessions of its best turns, read in one statement.

``recall_scored`` (``recall.py``) ranks a turn with its neighbours in its session (the turn
before and after it, ``turn_ranking``); this reads those sessions' turns, one row a session,
with each turn's cosine with the query (and, with an echo, with the query plus the best turns'
mean: ``turn_ranking.ECHO_WEIGHT``), through the index on ``(project_id, user_id,
session_id)`` (migration 0010) and each turn's vector by its key. A session of at most
``WHOLE_SESSION`` turns is read whole; a longer one only ``WINDOW`` turns either side of each
of the best turns in it, so a recall's cost stops growing with a session that never ends (an
agent's one long thread): a recall of three common words in one session of 3,000 turns took
~59 ms, 39 of them this process's CPU, reading it whole (BENCHMARKS.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from worker.db.vectors import VECTOR_TABLE
from worker.user_memory.turn_ranking import Turn, speaker_of

CONTEXT_ROWS = 5_000
WHOLE_SESSION = 200
"""A session of at most this many turns is read whole (LoCoMo's longest has 43: its figures
are those of sessions read whole); a longer one around its best turns only (``WINDOW``)."""
WINDOW = 20
"""How many turns either side of each best turn a session longer than ``WHOLE_SESSION`` is
read: a LoCoMo session's worth around each (turns only a few apart share one window)."""
HEAD = 80
"""Characters of a turn's input read for its speaker."""


QUERY_VECTOR = "CAST(:qv AS vector)"
"""The query's vector: a parameter of type ``vector`` (sent in pgvector's text form), parsed
once when the statement is bound. Cast from ``text`` inside the statement, a generic plan (which
Postgres may keep after five runs of a prepared statement, before ``recall._CUSTOM_PLANS`` holds for
the recall) parsed its 384 floats again for every row scored: the exact search of one user's
419 turns (LoCoMo's conv-26 alone in its project) took ~85 ms instead of ~2 ms from the sixth
recall on (BENCHMARKS.md, LoCoMo)."""


def cosine_sql(dimension: int) -> str:
    return f"1 - (v.embedding::vector({dimension}) <=> {QUERY_VECTOR})"


async def read_context_sessions(
    conn: AsyncConnection,
    where: list[str],
    params: dict[str, Any],
    turns: dict[str, Turn],
    sessions: Sequence[str],
    dimension: int | None,
    floor: float,
    echo: Sequence[str] = (),
    best: Sequence[str] = (),
) -> None:
    """The turns of ``sessions`` into ``turns`` (a session longer than ``WHOLE_SESSION`` only
    within ``WINDOW`` of one of the ``best`` turns), each linked to the one just before and
    after it (by time, then by when it was stored) when that one was read too, with its length
    and, for a new one, its cosine (at any value: a neighbour's meaning counts only through its
    share); with ``echo`` (the first ranking's best turns), each turn's cosine with the query's
    vector plus the mean of theirs (``Turn.echo``: ``turn_ranking.ECHO_WEIGHT``), in the same
    statement."""
    cosine = f", {cosine_sql(dimension)} AS cosine" if dimension else ", NULL AS cosine"
    if dimension and echo:
        mean = (
            f"(SELECT avg(x.embedding::vector({dimension})) FROM {VECTOR_TABLE} x"
            " WHERE x.episode_id = ANY(CAST(:echo AS uuid[])) AND x.model = :m"
            f" AND x.dimension = {dimension})"
        )
        echoed = f"({QUERY_VECTOR} + {mean})"  # Rocchio's query: the query plus their mean
        cosine += f", 1 - (v.embedding::vector({dimension}) <=> {echoed}) AS echo"
    else:
        cosine += ", NULL AS echo"
    # each turn's vector by its key (a hash join read all 10,000 of the model to keep ~500;
    # OFFSET 0: Postgres would fold the lateral sub-select into that hash join again)
    join = (
        f" LEFT JOIN LATERAL (SELECT embedding FROM {VECTOR_TABLE} v WHERE v.episode_id = e.id"
        f" AND v.model = :m AND v.dimension = {dimension} OFFSET 0) v ON true"
        if dimension
        else ""
    )
    # the sessions longer than ``WHOLE_SESSION`` (each counted to one past it, by the index);
    # their turns near a best turn, numbered (how many best turns are within ``WINDOW`` of
    # each: a frame of fixed width; ``row_number`` ignores the frame); then the statement as it
    # is for short sessions (no window function: ~0.8 ms more on LoCoMo's), a long session's
    # turns only those near a best turn, with their numbers
    mine = f"{' AND '.join(where)} AND e.turn_id IS NOT NULL"
    order = "e.occurred_at, e.recorded_at, e.id"
    by = "s.occurred_at, s.recorded_at, s.id"
    statement = text(
        "WITH long AS MATERIALIZED (SELECT l.s FROM unnest(CAST(:sessions AS text[])) l(s)"
        f" WHERE (SELECT count(*) FROM (SELECT 1 FROM episodes e WHERE {mine}"
        f" AND e.session_id = l.s LIMIT {WHOLE_SESSION + 1}) c) > {WHOLE_SESSION}),"
        " near AS MATERIALIZED (SELECT w.id, w.pos FROM (SELECT e.id,"
        " row_number() OVER w AS pos,"
        " count(CASE WHEN e.id = ANY(CAST(:best AS uuid[])) THEN 1 END) OVER w AS near"
        f" FROM episodes e WHERE {mine} AND e.session_id IN (SELECT s FROM long)"
        f" WINDOW w AS (PARTITION BY e.session_id ORDER BY {order}"
        f" ROWS BETWEEN {WINDOW} PRECEDING AND {WINDOW} FOLLOWING)) w WHERE w.near > 0)"
        f" SELECT s.session_id, array_agg(s.id::text ORDER BY {by}) AS ids,"
        f" array_agg(s.head ORDER BY {by}) AS heads, array_agg(s.n ORDER BY {by}) AS ns,"
        f" array_agg(s.cosine ORDER BY {by}) AS cosines,"
        f" array_agg(s.occurred_at ORDER BY {by}) AS ats,"
        f" array_agg(s.echo ORDER BY {by}) AS echoes,"
        f" array_agg(s.pos ORDER BY {by}) AS positions FROM ("
        "SELECT e.id, e.session_id, e.occurred_at, e.recorded_at,"
        f" left(e.input, {HEAD}) AS head, length(e.search_vector) AS n,"
        f" nr.pos{cosine} FROM episodes e LEFT JOIN near nr ON nr.id = e.id{join}"
        f" WHERE {mine} AND e.session_id = ANY(CAST(:sessions AS text[]))"
        " AND (e.session_id NOT IN (SELECT s FROM long) OR nr.id IS NOT NULL)"
        f" ORDER BY e.session_id, {order} LIMIT {CONTEXT_ROWS}"
        ") s GROUP BY s.session_id"
    )
    # one row a session, its turns in order (by time, then by when each was stored): a row a
    # turn cost a driver record and a result row each, ~500 for 30 LoCoMo sessions
    bound = {**params, "sessions": list(sessions), "best": list(best)}
    for session, ids, heads, lengths, cosines, ats, echoes, positions in await conn.execute(
        statement, {**bound, **({"echo": list(echo)} if echo else {})}
    ):
        previous: Turn | None = None
        at_previous: int | None = None  # a short session's turns have no number: all read
        for key, head, n, cos, at, mean, pos in zip(
            ids, heads, lengths, cosines, ats, echoes, positions, strict=True
        ):
            turn = turns.get(key)
            if turn is None:
                turn = turns[key] = Turn(key, speaker=speaker_of(head), at=at)
            turn.session = session
            if turn.cosine is None and cos is not None and float(cos) >= floor:
                turn.cosine = float(cos)
            if mean is not None:
                turn.echo = float(mean)
            if not turn.counts:
                turn.length = int(n or 0)
            if previous is not None and (pos is None or pos == (at_previous or 0) + 1):
                previous.after, turn.before = key, previous.id
            previous, at_previous = turn, pos
