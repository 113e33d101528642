"""``recall_scored``: a user's episodes (turns and sessions) by words and meaning together.

Two searches, each inside the user's partition and the time range, then one ranking of the
turns they found and of those turns' neighbours (``turn_ranking``: BM25, the cosine, the
turn before and after in its session, the speaker, month or year the query names, the echo
of the best turns' vectors), weighted by LoomFlow's ``alpha`` (0 words only, 1 meaning only).

- **Words**: Postgres full text over ``search_vector`` (English stemming; any word of the
  query matches, of at most ``MAX_QUERY_WORDS`` distinct words, common words last:
  ``worker.db.query_words``; at most ``TEXT_CAP`` matches are considered, as in
  ``episodes.text_search``),
  scored by BM25 over the lexemes of each match; ``bm25_score`` is that BM25. Findable as soon
  as ``remember`` returns.
- **Meaning**: pgvector cosine over the vectors the indexer made (``episode_embeddings``, and
  ``episode_chunk_embeddings`` for a long output's chunks: a turn's best); ``vector_score`` is
  the cosine similarity (-1..1). Used only when pgvector is there, the
  project has vectors of the model, and an embedder is configured (``Memory(embedder=...)``
  or the settings'). **Relevance floor**: a turn whose cosine is below ``min_similarity``
  (``MEMWORKER_RECALL_MIN_SIMILARITY``, default ``MIN_SIMILARITY``) is not a match by meaning:
  the nearest vectors of a query about nothing stored are not evidence.

A recall by meaning (``alpha`` > 0, a query) says which of the episodes it looked at (its word
matches and what it returns) have no vector of its model yet: ``EpisodeMatch.unindexed`` and
``ScoredMatches.unindexed`` (read with the matches and the returned rows: ``_HAS_VECTOR``).

As LoomFlow: an empty query returns the most recent episodes with score 1.0, and one nothing
matches (no word, no cosine at the floor) returns them with score 0.0, so an agent always
gets some context.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from worker.db.engine import Begin
from worker.db.query_words import words_of
from worker.db.vectors import CHUNK_TABLE, VECTOR_TABLE, has_chunk_table, vector_literal
from worker.episodes.text_search import TEXT_CAP
from worker.user_memory.models import EpisodeMatch, ScoredMatches, as_utc
from worker.user_memory.recall_sessions import (
    HEAD,
    QUERY_VECTOR,
    read_context_sessions,
)
from worker.user_memory.turn_ranking import (
    ECHO_TURNS,
    Turn,
    rank,
    speaker_of,
    tsvector_counts,
)
from worker.user_memory.turns import (
    EPISODE_COLUMNS,
    episode_from_row,
    keyed_episodes_of,
    partition,
)

MIN_SIMILARITY = 0.2
"""Default of ``MEMWORKER_RECALL_MIN_SIMILARITY``: all-MiniLM-L6-v2 puts unrelated texts at
~0..0.2 and paraphrases above ~0.4 (``tests/recall``)."""
CANDIDATES = 50
"""How many turns each search brings at least (the vector search's nearest)."""
CONTEXT_SESSIONS = 30
"""The sessions of the best this many turns are read whole, for their turns' neighbours (read
for the best 30 turns only, LoCoMo's R@10 fell 0.005: BENCHMARKS.md)."""
PARTITION_BOUND = 100_000


def _filters(user_id: str | None, time_range: tuple[datetime, datetime] | None) -> list[str]:
    where = ["e.project_id = :p", partition(user_id, "e.user_id")]
    if time_range is not None:
        where.append("e.occurred_at BETWEEN :lo AND :hi")
    return where


async def _words(
    conn: AsyncConnection,
    query: str,
    where: list[str],
    params: dict[str, Any],
    turns: dict[str, Turn],
    by_index: bool,
    unindexed: set[str] | None = None,
) -> tuple[list[str], int]:
    """The query's lexemes (at most ``MAX_QUERY_WORDS``: ``worker.db.query_words``) and the
    partition's size (BM25's ``N``, up to ``PARTITION_BOUND``); each match's counts of the
    lexemes into ``turns``. At most ``TEXT_CAP``
    turns holding any word, plus up to as many holding all of them (``episodes.text_search``:
    the GIN index finds them; only these are read). ``by_index``: the transaction already reads
    by index (``_meaning`` set it), else this sets it first. ``unindexed``: the matches without a
    vector of the model ``:m`` are added to it (``_HAS_VECTOR``). One statement."""
    columns = (
        f"e.id, e.session_id, e.turn_id, e.occurred_at, left(e.input, {HEAD}) AS head,"
        " length(e.search_vector) AS n, e.search_vector AS sv"
    )
    searched = await words_of(conn, query, "episodes")
    tiers = " UNION ".join(
        f"(SELECT {columns} FROM episodes e WHERE {' AND '.join(where)}"
        f" AND e.search_vector @@ {words} LIMIT {TEXT_CAP})"
        for words in (searched.all, searched.any)
    )
    statement = (
        f"WITH q AS (SELECT {searched.lexemes} AS lexemes,"
        " (SELECT count(*) FROM (SELECT 1 FROM episodes e"
        f" WHERE {' AND '.join(where)} LIMIT {PARTITION_BOUND}) s) AS total)"
        " SELECT q.lexemes, q.total, m.id::text, m.session_id, m.turn_id IS NOT NULL,"
        f" m.occurred_at, m.head, m.n, {_COUNTS.format('q.lexemes')} AS counts,"
        f" {_HAS_VECTOR.format('m.id') if unindexed is not None else 'true'} AS indexed"
        f" FROM q LEFT JOIN ({tiers}) m ON true"
    )
    if not by_index:
        await conn.execute(text(_BY_INDEX_PLANNED))  # for the rest of the recall's transaction
    lexemes: list[str] = []
    total = 0
    # the rows unpacked as tuples, the id as text from Postgres: a recall reads thousands
    for found, size, key, session, is_turn, at, head, n, counts, indexed in await conn.execute(
        text(statement), {**params, **searched.params, "q": query}
    ):
        lexemes, total = found or [], int(size)
        if key is None:
            break
        turns[key] = Turn(
            key,
            session if is_turn else None,
            tsvector_counts(counts),
            int(n),
            speaker=speaker_of(head),
            at=at,
        )
        if unindexed is not None and not indexed:
            unindexed.add(key)
    return sorted(set(lexemes)), total


_HAS_VECTOR = f"EXISTS (SELECT 1 FROM {VECTOR_TABLE} x WHERE x.episode_id = {{}} AND x.model = :m)"
"""Whether an episode (its id's SQL) has a vector of the recall's model: read with the word
matches and with the rows returned, not by a statement of its own (a round trip, and every
match's id sent back to the server)."""


_COUNTS = "ts_filter(setweight(setweight(m.sv, 'D'), 'A', {}), '{{a}}')"
"""A turn's query lexemes with their positions, picked out in Postgres (the turn's whole
``search_vector`` is not sent): by weight (every position weighted D, theirs A, the A kept;
every lexeme of ``search_vector``, ``to_tsvector``'s, has a position). Sent as that small
``tsvector``'s text and counted here (``turn_ranking.tsvector_counts``: the lexemes and their
positions in ``unnest``'s order): unnesting it and aggregating the counts in Postgres, a
sub-select for each match, was ~30 % of the words search at 1,848 matches; unnesting every
lexeme to keep two or three made it ~1.7× as long (BENCHMARKS.md, the memory inspector)."""


_CUSTOM_PLANS = "set_config('plan_cache_mode', 'force_custom_plan', true)"
"""The recall's statements after it are planned for their values: the driver prepares every
statement, and after five runs Postgres may keep a generic plan, made without the user, the
query's words or the sessions: the words search over 10,000 turns took ~4× as long with one
(BENCHMARKS.md, the memory inspector)."""
_BY_INDEX_PLANNED = f"SELECT set_config('enable_seqscan', 'off', true), {_CUSTOM_PLANS}"
"""``BY_INDEX`` and ``_CUSTOM_PLANS`` for the rest of the transaction, in one round trip."""
_READ_BY_INDEX = (
    f"(SELECT set_config('enable_seqscan', 'off', true) || {_CUSTOM_PLANS})"
    " = 'offforce_custom_plan'"
)
"""``_BY_INDEX_PLANNED`` as a condition evaluated once when the statement starts: it holds for
the statements after it in the transaction (this one is planned already), saving the words
search a round trip (each costs most on loaded cores)."""


async def _meaning(
    conn: AsyncConnection,
    where: list[str],
    params: dict[str, Any],
    turns: dict[str, Turn],
    dimension: int,
    exact: bool,
    floor: float,
) -> None:
    """The nearest vectors (a long output's chunks among them) at or above the floor, their
    cosines into ``turns``; leaves the transaction reading by index (``_READ_BY_INDEX``)."""
    distance = f"v.embedding::vector({dimension}) <=> {QUERY_VECTOR}"
    mine = f"project_id = :p AND model = :m AND dimension = {dimension}"
    chunks = await _has_chunks(conn)
    vectors = VECTOR_TABLE
    if exact and chunks:  # a small partition: its chunks in the same exact scan
        vectors = (
            f"(SELECT episode_id, embedding FROM {VECTOR_TABLE} WHERE {mine}"
            f" UNION ALL SELECT episode_id, embedding FROM {CHUNK_TABLE} WHERE {mine})"
        )
    condition = "true" if vectors != VECTOR_TABLE else f"v.{mine.replace(' AND ', ' AND v.')}"
    joined = (
        f" FROM {vectors} v JOIN episodes e ON e.id = v.episode_id"
        f" WHERE {condition} AND {' AND '.join(where)} AND {_READ_BY_INDEX}"
    )
    if exact:  # ordered by an expression the HNSW index cannot serve: exactly
        # each distance taken once (a sub-select Postgres does not fold: OFFSET 0), the cosine
        # and the head only of the nearest: the same join, sort and rows (BENCHMARKS.md)
        nearest = text(
            f"SELECT id, session_id, turn_id, occurred_at, left(input, {HEAD}) AS head,"
            " 1 - d AS cosine FROM (SELECT * FROM (SELECT e.id, e.session_id, e.turn_id,"
            f" e.occurred_at, e.input, {distance} AS d{joined} OFFSET 0) x"
            " ORDER BY d + 0 LIMIT :n) y"
        )
    else:
        nearest = text(
            f"SELECT e.id, e.session_id, e.turn_id, e.occurred_at, left(e.input, {HEAD}) AS head,"
            f" 1 - ({distance}) AS cosine{joined} ORDER BY {distance} LIMIT :n"
        )
    if not exact:
        await conn.execute(text(f"SET LOCAL hnsw.ef_search = {min(1000, max(40, params['n']))}"))
    found = list(await conn.execute(nearest, params))
    if chunks and not exact:
        chunked = text(
            f"SELECT e.id, e.session_id, e.turn_id, e.occurred_at, left(e.input, {HEAD}) AS head,"
            f" max(1 - ({distance})) AS cosine FROM {CHUNK_TABLE} v"
            " JOIN episodes e ON e.id = v.episode_id"
            f" WHERE v.{mine.replace(' AND ', ' AND v.')} AND {' AND '.join(where)}"
            " GROUP BY e.id ORDER BY 6 DESC LIMIT :n"
        )
        found.extend(await conn.execute(chunked, params))
    for row in found:
        cosine = float(row.cosine)
        if cosine < floor:
            continue
        key = str(row.id)
        turn = turns.get(key)
        if turn is None:
            turn = turns[key] = Turn(
                key,
                session=row.session_id if row.turn_id is not None else None,
                speaker=speaker_of(row.head),
                at=row.occurred_at,
            )
        turn.cosine = max(cosine, turn.cosine or -1.0)


_CHUNKS: set[str] = set()
"""The databases (by URL) seen to have the chunks' table: checked again until one has."""


async def _has_chunks(conn: AsyncConnection) -> bool:
    """Whether the chunks' table is there (``worker.db.vectors.CHUNK_TABLE``; a schema migrated
    before it has none until ``memworker migrate``)."""
    key = str(conn.engine.url)
    if key not in _CHUNKS and await has_chunk_table(conn):
        _CHUNKS.add(key)
    return key in _CHUNKS


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
    min_similarity: float = MIN_SIMILARITY,
    embedding: Awaitable[list[float] | None] | None = None,
    beside: Begin | None = None,
) -> ScoredMatches:
    """The user's episodes best matching ``query`` (module doc), at most ``limit``; ``exact``:
    search the partition's vectors exactly rather than by the HNSW index (a small partition:
    the index's scan would filter the user's after it, finding few or none). ``embedding``:
    the query's vector still being computed (in place of ``query_vector``): the words half
    runs meanwhile, and the meaning half once it is there (None: words only). ``beside``: a
    second connection for the meaning half, run at once with the words half (same results)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is between 0 and 1, not {alpha}")
    limit = max(0, int(limit))
    if limit == 0:
        return ScoredMatches()
    params: dict[str, Any] = {"p": project_id, "u": user_id, "n": max(limit, CANDIDATES)}
    if time_range is not None:
        params["lo"], params["hi"] = as_utc(time_range[0]), as_utc(time_range[1])
    where = _filters(user_id, time_range)
    turns: dict[str, Turn] = {}
    by_words: dict[str, Turn] = {}
    lexemes: list[str] = []
    total = 0
    words = bool(query.strip()) and alpha < 1.0
    # the episodes looked at without a vector of the model: wanted by a recall by meaning only
    unindexed: set[str] | None = None
    searched = False  # the meaning half ran already (beside the words half)
    if words and embedding is not None and model is not None:  # while the query embeds
        unindexed = set()
        words_half = _words(conn, query, where, {**params, "m": model}, by_words, False, unindexed)
        if beside is not None and alpha > 0.0:
            meaning_half = _meaning_beside(
                beside, embedding, where, params, turns, exact, min_similarity, model
            )
            (lexemes, total), query_vector = await asyncio.gather(words_half, meaning_half)
            embedding, searched = None, True
        else:
            lexemes, total = await words_half
        words = False
    if embedding is not None:
        query_vector = await embedding
    dimension = None
    if query.strip() and alpha > 0.0 and query_vector is not None and model is not None:
        dimension = len(query_vector)
        params.update(qv=vector_literal(query_vector), m=model)
        if not searched:
            await _meaning(conn, where, params, turns, dimension, exact, min_similarity)
    if dimension is None:
        unindexed = None
    elif unindexed is None:
        unindexed = set()
    if words:
        by_index = dimension is not None
        lexemes, total = await _words(conn, query, where, params, by_words, by_index, unindexed)
    # the words half's turns after the meaning half's: a turn both found is the words half's,
    # with the cosine the meaning half found (a context session would read it again, but only
    # the best sessions are read: without this it was lost for the rest)
    for key, turn in by_words.items():
        found = turns.get(key)
        if found is not None and found.cosine is not None:
            turn.cosine = found.cosine
    turns.update(by_words)
    if not turns:
        recent = await keyed_episodes_of(
            conn, project_id, user_id, newest_first=True, limit=None if time_range else limit
        )
        if time_range is not None:
            lo, hi = params["lo"], params["hi"]
            recent = [(k, e) for k, e in recent if lo <= e.occurred_at <= hi]
        neutral = 0.0 if query.strip() else 1.0  # LoomFlow's: no query is no evidence against
        keyed = dict(recent[:limit])
        missing = await _unindexed(conn, list(keyed), query, alpha, query_vector, model)
        return _matches(
            [
                EpisodeMatch(episode=e, score=neutral, unindexed=k in missing)
                for k, e in keyed.items()
            ],
            len(missing),
        )
    first, _bm25 = rank(
        turns, query, alpha=alpha, total=total, lexemes=lexemes, floor=min_similarity
    )
    best = sorted(first, key=lambda k: -first[k])[:CONTEXT_SESSIONS]
    sessions = sorted({s for s in (turns[k].session for k in best) if s is not None})
    if sessions:
        echo = best[:ECHO_TURNS] if dimension is not None else []
        await read_context_sessions(
            conn, where, params, turns, sessions, dimension, min_similarity, echo, best
        )
    scored, bm25 = rank(
        turns, query, alpha=alpha, total=total, lexemes=lexemes, floor=min_similarity
    )
    chosen = sorted(scored, key=lambda k: (-scored[k], k))[:limit]
    indexed = _HAS_VECTOR.format("id") if unindexed is not None else "true"
    rows = await conn.execute(
        text(
            f"SELECT {EPISODE_COLUMNS}, {indexed} AS indexed FROM episodes"
            " WHERE id = ANY(CAST(:ids AS uuid[]))"
        ),
        {"ids": chosen, **({"m": model} if unindexed is not None else {})},
    )
    by_id = {str(r.id): r for r in rows}
    if unindexed is not None:
        missing = unindexed | {k for k, r in by_id.items() if not r.indexed}
    elif not query.strip() or alpha == 0.0:  # not a recall by meaning: nothing is missing
        missing = set()
    else:  # by meaning, without a query vector or a model: every episode looked at
        missing = {*chosen, *(k for k, t in turns.items() if t.counts)}
    return _matches(
        [
            EpisodeMatch(
                episode=episode_from_row(by_id[k]),
                score=scored[k],
                bm25_score=bm25.get(k),
                vector_score=turns[k].cosine,
                unindexed=k in missing,
            )
            for k in chosen
            if k in by_id
        ],
        len(missing),
    )


async def _meaning_beside(
    beside: Begin,
    embedding: Awaitable[list[float] | None],
    where: list[str],
    params: dict[str, Any],
    turns: dict[str, Turn],
    exact: bool,
    floor: float,
    model: str,
) -> list[float] | None:
    """``_meaning`` on a connection of ``beside`` once the query's vector (returned) is there,
    set as the words half leaves its own (``_BY_INDEX_PLANNED``: the same plans and results)."""
    vector = await embedding
    if vector is None:
        return None
    found = {**params, "qv": vector_literal(vector), "m": model}
    async with beside() as conn:
        await conn.execute(text(_BY_INDEX_PLANNED))
        await _meaning(conn, where, found, turns, len(vector), exact, floor)
    return vector


def _matches(found: list[EpisodeMatch], unindexed: int) -> ScoredMatches:
    matches = ScoredMatches(found)
    matches.unindexed = unindexed
    return matches


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
