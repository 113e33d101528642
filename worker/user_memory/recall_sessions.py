"""A recall's context: the sessions of its best turns, read in one statement.

``recall_scored`` (``recall.py``) ranks a turn with its neighbours in its session (the turn
before and after it, ``turn_ranking``); this reads those sessions' turns, one row a session,
with each turn's cosine with the query (and, with an echo, with the query plus the best turns'
mean: ``turn_ranking.ECHO_WEIGHT``), through the index on ``(project_id, user_id,
session_id)`` (migration 0010) and each turn's vector by its key. Of a session longer than
``WHOLE_SESSION`` turns only those within ``WINDOW`` of one of its best turns are ranked
(``kept``), so the ranking's cost stops growing with a session that never ends (an agent's one
long thread): in a session of 10,000 turns a recall's CPU here went from ~65 to ~36 ms
(BENCHMARKS.md). Postgres still reads such a session (up to ``CONTEXT_ROWS`` turns in all):
windows chosen in SQL (every turn numbered by a window function) cost each of LoCoMo's recalls,
whose sessions are short, ~1 ms more, and were reverted.
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
"""A session of at most this many turns is ranked whole (LoCoMo's longest has 43: its figures
are those of sessions ranked whole); a longer one around its best turns only (``WINDOW``)."""
WINDOW = 20
"""How many turns either side of each best turn of a session longer than ``WHOLE_SESSION`` are
ranked: a LoCoMo session's worth around each (turns only a few apart share one window)."""
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
    within ``WINDOW`` of one of the ``best`` turns: ``kept``), each linked to the one just
    before and after it (by time, then by when it was stored) when that one was kept too, with
    its length and, for a new one, its cosine (at any value: a neighbour's meaning counts only
    through its share); with ``echo`` (the first ranking's best turns), each turn's cosine
    with the query's vector plus the mean of theirs (``Turn.echo``:
    ``turn_ranking.ECHO_WEIGHT``), in the same statement."""
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
    order = "s.occurred_at, s.recorded_at, s.id"
    statement = text(
        f"SELECT s.session_id, array_agg(s.id::text ORDER BY {order}) AS ids,"
        f" array_agg(s.head ORDER BY {order}) AS heads, array_agg(s.n ORDER BY {order}) AS ns,"
        f" array_agg(s.cosine ORDER BY {order}) AS cosines,"
        f" array_agg(s.occurred_at ORDER BY {order}) AS ats,"
        f" array_agg(s.echo ORDER BY {order}) AS echoes FROM ("
        f"SELECT e.id, e.session_id, e.occurred_at, e.recorded_at, left(e.input, {HEAD}) AS head,"
        f" length(e.search_vector) AS n{cosine} FROM episodes e{join}"
        f" WHERE {' AND '.join(where)} AND e.turn_id IS NOT NULL"
        " AND e.session_id = ANY(CAST(:sessions AS text[]))"
        f" ORDER BY e.session_id, e.occurred_at, e.recorded_at, e.id LIMIT {CONTEXT_ROWS}"
        ") s GROUP BY s.session_id"
    )
    # one row a session, its turns in order (by time, then by when each was stored): a row a
    # turn cost a driver record and a result row each, ~500 for 30 LoCoMo sessions
    marked = set(best)
    for session, ids, heads, lengths, cosines, ats, echoes in await conn.execute(
        statement, {**params, "sessions": list(sessions), **({"echo": list(echo)} if echo else {})}
    ):
        previous: Turn | None = None
        at_previous = -1
        for at in kept(ids, marked):
            key = ids[at]
            turn = turns.get(key)
            if turn is None:
                turn = turns[key] = Turn(key, speaker=speaker_of(heads[at]), at=ats[at])
            turn.session = session
            cos = cosines[at]
            if turn.cosine is None and cos is not None and float(cos) >= floor:
                turn.cosine = float(cos)
            if echoes[at] is not None:
                turn.echo = float(echoes[at])
            if not turn.counts:
                turn.length = int(lengths[at] or 0)
            if previous is not None and at == at_previous + 1:  # never across a gap
                previous.after, turn.before = key, previous.id
            previous, at_previous = turn, at


def kept(ids: Sequence[str], best: set[str]) -> Sequence[int]:
    """Which of a session's turns (``ids``, in order) a recall considers: all of a session of
    at most ``WHOLE_SESSION`` turns, else those within ``WINDOW`` of one of ``best``."""
    if len(ids) <= WHOLE_SESSION:
        return range(len(ids))
    near: set[int] = set()
    for at, key in enumerate(ids):
        if key in best:
            near.update(range(max(0, at - WINDOW), min(len(ids), at + WINDOW + 1)))
    return sorted(near)
