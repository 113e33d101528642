"""``recall_scored``: a user's episodes (turns and sessions) by words and meaning together.

Two searches, each inside the user's partition and the time range, fused by weighted
Reciprocal Rank Fusion (LoomFlow's ``alpha``: 0 words only, 1 meaning only, 0.5 both;
``k`` = 60): ``score = (1 - alpha) / (60 + word rank) + alpha / (60 + meaning rank)``.

- **Words**: Postgres full text over ``search_vector`` (English stemming; any word of the
  query matches; at most ``TEXT_CAP`` matches are ranked, as in ``episodes.text_search``);
  ``bm25_score`` is its ``ts_rank``. Findable as soon as ``remember`` returns.
- **Meaning**: pgvector cosine over the vectors the indexer made (``episode_embeddings``);
  ``vector_score`` is the cosine similarity (-1..1; non-positive ones are dropped, as
  LoomFlow does). Used only when pgvector is there, the project has vectors of the model, and
  an embedder is configured (``Memory(embedder=...)`` or the settings').

A recall by meaning (``alpha`` > 0, a query) says which of the episodes it looked at (its word
matches and what it returns) have no vector of its model yet: ``EpisodeMatch.unindexed`` and
``ScoredMatches.unindexed`` (a lookup of at most ~60 vector keys).

As LoomFlow: an empty query returns the most recent episodes with score 1.0, and one nothing
matches returns them with score 0.0, so an agent always gets some context.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import column, desc, select, table, text
from sqlalchemy.ext.asyncio import AsyncConnection

from worker.db.vectors import VECTOR_TABLE, vector_literal
from worker.episodes.embedding import Embedder
from worker.episodes.text_search import BY_INDEX, TEXT_CAP, UNSET_BY_INDEX, ranked_matches
from worker.user_memory.models import Episode, EpisodeMatch, ScoredMatches, as_utc
from worker.user_memory.turns import (
    EPISODE_COLUMNS,
    SessionEpisode,
    episode_from_row,
    episodes_of,
    partition,
    turn_uuid,
)

RRF_K = 60
_E_COLUMNS = ", ".join(f"e.{c.strip()}" for c in EPISODE_COLUMNS.split(","))
_NAMES = [c.strip() for c in EPISODE_COLUMNS.split(",")]
_MATCHED = table(
    "episodes", *(column(c) for c in [*_NAMES, "importance_score", "search_vector"])
).alias("e")
"""``episodes`` as the words search reads it (the filters name it ``e``)."""
_ROW = table("episodes", *(column(c) for c in _NAMES)).alias("r")


def _filters(user_id: str | None, time_range: tuple[datetime, datetime] | None) -> list[str]:
    where = ["e.project_id = :p", partition(user_id, "e.user_id")]
    if time_range is not None:
        where.append("e.occurred_at BETWEEN :lo AND :hi")
    return where


async def recall_scored(
    conn: AsyncConnection,
    project_id: str,
    query: str,
    *,
    limit: int,
    time_range: tuple[datetime, datetime] | None,
    user_id: str | None,
    alpha: float,
    query_vector: list[float] | None,
    model: str | None,
    exact: bool = False,
) -> ScoredMatches:
    """The user's episodes best matching ``query`` (module doc), at most ``limit``; ``exact``:
    search the partition's vectors exactly rather than by the HNSW index (a small partition:
    the index's scan would filter the user's after it, finding few or none)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is between 0 and 1, not {alpha}")
    limit = max(0, int(limit))
    if limit == 0:
        return ScoredMatches()
    params: dict[str, Any] = {"p": project_id, "u": user_id, "q": query, "n": max(limit, 50)}
    if time_range is not None:
        params["lo"], params["hi"] = as_utc(time_range[0]), as_utc(time_range[1])
    where = _filters(user_id, time_range)
    rows: dict[str, Any] = {}
    words: list[tuple[str, float]] = []
    if query.strip() and alpha < 1.0:
        matched = ranked_matches(
            _MATCHED, query, [text(w) for w in where], params["n"], TEXT_CAP
        ).subquery("m")
        statement = (
            select(*_ROW.c, matched.c.rank.label("bm25"))
            .join_from(_ROW, matched, _ROW.c.id == matched.c.id)
            .order_by(desc(matched.c.rank), desc(matched.c.occurred_at), matched.c.id)
        )
        await conn.execute(text(BY_INDEX))
        for row in await conn.execute(statement, params):
            key = str(row.id)
            rows[key] = row
            words.append((key, float(row.bm25)))
        await conn.execute(text(UNSET_BY_INDEX))
    meaning: list[tuple[str, float]] = []
    if query.strip() and alpha > 0.0 and query_vector is not None and model is not None:
        dimension = len(query_vector)
        distance = f"v.embedding::vector({dimension}) <=> CAST(CAST(:qv AS text) AS vector)"
        # a small partition is ordered by an expression the HNSW index cannot serve: exactly
        order = f"({distance}) + 0" if exact else distance
        nearest = text(
            f"SELECT {_E_COLUMNS}, 1 - ({distance}) AS cosine FROM {VECTOR_TABLE} v"
            " JOIN episodes e ON e.id = v.episode_id"
            f" WHERE v.project_id = :p AND v.model = :m AND v.dimension = {dimension}"
            f" AND {' AND '.join(where)} ORDER BY {order} LIMIT :n"
        )
        params.update(qv=vector_literal(query_vector), m=model)
        if not exact:
            ef_search = min(1000, max(40, limit * 4))
            await conn.execute(text(f"SET LOCAL hnsw.ef_search = {ef_search}"))
        for row in await conn.execute(nearest, params):
            if float(row.cosine) > 0:
                key = str(row.id)
                rows.setdefault(key, row)
                meaning.append((key, float(row.cosine)))
    fused: dict[str, float] = {}
    for weight, ranking in ((1.0 - alpha, words), (alpha, meaning)):
        for rank, (key, _score) in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + weight / (RRF_K + rank)
    if not fused:
        recent = await episodes_of(
            conn, project_id, user_id, newest_first=True, limit=None if time_range else limit
        )
        if time_range is not None:
            lo, hi = params["lo"], params["hi"]
            recent = [e for e in recent if lo <= e.occurred_at <= hi]
        neutral = 0.0 if query.strip() else 1.0  # LoomFlow's: no query is no evidence against
        keyed = {_row_key(project_id, e): e for e in recent[:limit]}
        missing = await _unindexed(conn, list(keyed), query, alpha, query_vector, model)
        return _matches(
            [
                EpisodeMatch(episode=e, score=neutral, unindexed=k in missing)
                for k, e in keyed.items()
            ],
            len(missing),
        )
    bm25, cosine = dict(words), dict(meaning)
    best = sorted(fused, key=lambda k: (-fused[k], -rows[k].occurred_at.timestamp(), k))
    missing = await _unindexed(conn, list(rows), query, alpha, query_vector, model)
    return _matches(
        [
            EpisodeMatch(
                episode=episode_from_row(rows[k]),
                score=fused[k],
                bm25_score=bm25.get(k),
                vector_score=cosine.get(k),
                unindexed=k in missing,
            )
            for k in best[:limit]
        ],
        len(missing),
    )


def _matches(found: list[EpisodeMatch], unindexed: int) -> ScoredMatches:
    matches = ScoredMatches(found)
    matches.unindexed = unindexed
    return matches


def _row_key(project_id: str, episode: Episode) -> str:
    """The ``episodes`` row id of a recalled episode (a turn's is derived from its id)."""
    if isinstance(episode, SessionEpisode):
        return episode.id
    return str(turn_uuid(project_id, episode.id))


async def _unindexed(
    conn: AsyncConnection,
    keys: list[str],
    query: str,
    alpha: float,
    query_vector: list[float] | None,
    model: str | None,
) -> set[str]:
    """Which of ``keys`` (row ids) have no vector of ``model``: all of them when the recall
    had no vectors to use; none when it did not want them (no query, or words only)."""
    if not keys or not query.strip() or alpha == 0.0:
        return set()
    if query_vector is None or model is None:
        return set(keys)
    found = await conn.execute(
        text(
            f"SELECT episode_id::text FROM {VECTOR_TABLE}"
            " WHERE episode_id = ANY(CAST(:ids AS uuid[])) AND model = :m"
        ),
        {"ids": keys, "m": model},
    )
    return set(keys) - {row[0] for row in found}


async def embed_query(embedder: Embedder | None, query: str) -> list[float] | None:
    if embedder is None or not query.strip():
        return None
    [vector] = await embedder.embed([query])
    return list(vector)
