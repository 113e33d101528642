"""The words half of recall (``EpisodeStore.recall``, ``Memory.recall_scored``): the episodes
matching any word of the query, ranked by ``ts_rank``, with a bounded cost.

**Why a cap.** Any word of the query matches, so a query with a common word matches a share of
the whole store: ~3,500-10,500 of 100k episodes for the labeled queries in
``bench/recall_latency.py``, ~10x that at 1M. Ranking them all (reading each matching row from
the heap, then ``ts_rank``) cost 10-67 ms at 100k, most of a recall's time, and grows with the
store. So at most ``cap`` matches are ranked (``TEXT_CAP``): the GIN index still finds every
match (a bitmap, cheap), but only the first ``cap`` rows the scan reads are ranked, plus every
episode holding **all** the query's words (at most ``cap`` more; GIN intersects the words, so
this stays small), which are the ones ``ts_rank`` puts first. A query is searched by at most
``MAX_QUERY_WORDS`` of its words (``worker.db.query_words``): a longer one costs no more. A
scope with at most ``cap`` matches is ranked exactly as without a cap. Above it, an episode
sharing only some of the query's common words may be missed by this search (the vector search
still finds it by meaning); BENCHMARKS.md has the measured cost and the labeled recall either
way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Text,
    cast,
    desc,
    func,
    literal,
    literal_column,
    select,
    union,
)
from sqlalchemy.dialects.postgresql import ARRAY, TSQUERY
from sqlalchemy.sql.elements import TextClause

from worker.db.models import SEARCH_CONFIG
from worker.db.query_words import tsquery_text

TEXT_CAP = 1_000
"""Default of ``EpisodeStore(text_cap=)``: how many matches of any word are ranked at most."""

BY_INDEX = "SET LOCAL enable_seqscan = off"
"""Run before ``ranked_matches`` with a cap (in its transaction): with a ``LIMIT`` the planner
may read the table in order and stop at the cap, which its estimate of the matches makes look
cheap (measured: a seq scan of the whole 10k table per tier, 12 ms against 5 ms by the GIN
index, and one that stops only after ~8% of 100k rows); the GIN index bounds it either way."""
UNSET_BY_INDEX = "SET LOCAL enable_seqscan TO DEFAULT"


def any_word(query: Any, bounded: list[str] | None = None) -> ColumnElement[Any]:
    """The query's words joined by OR: an episode sharing some of them matches. ``bounded``:
    the words a long query is searched by (``worker.db.query_words``), given as a value."""
    if bounded is not None:
        return cast(literal(tsquery_text(bounded, "|"), Text), TSQUERY)
    words = func.plainto_tsquery(SEARCH_CONFIG, query)
    return cast(func.replace(cast(words, Text), "&", "|"), TSQUERY)


def all_words(query: Any, bounded: list[str] | None = None) -> ColumnElement[Any]:
    """The query's words joined by AND (``bounded``: as ``any_word``)."""
    if bounded is not None:
        return cast(literal(tsquery_text(bounded, "&"), Text), TSQUERY)
    return func.plainto_tsquery(SEARCH_CONFIG, query)


PAIRED_WORDS = 12
"""``two_words`` pairs at most this many of the query's distinct words (66 pairs): a query of
n words has n(n-1)/2 pairs, and a few hundred words would exceed Postgres' 1 MB tsquery."""


def two_words(query: Any, bounded: list[str] | None = None) -> ColumnElement[Any]:
    """Any two of the query's words (``(a & b) | (a & c) | ...``; NULL, matching nothing, for
    a query of one word; of a longer query, pairs of its first ``PAIRED_WORDS`` distinct words
    in the order Postgres sorts them). Each word goes through ``plainto_tsquery('simple',
    ...)`` and the pairs are joined as the text form Postgres itself writes, so no word can
    break the syntax. ``bounded``: as ``any_word`` (its first ``PAIRED_WORDS``)."""
    lexemes: Any = func.tsvector_to_array(func.to_tsvector(SEARCH_CONFIG, query))
    if bounded is not None:
        lexemes = cast(literal(sorted(bounded), ARRAY(Text)), ARRAY(Text))
    a = func.unnest(lexemes).table_valued("lexeme", with_ordinality="n").render_derived(name="a")
    b = func.unnest(lexemes).table_valued("lexeme", with_ordinality="n").render_derived(name="b")
    pair = func.plainto_tsquery("simple", a.c.lexeme).op("&&")(
        func.plainto_tsquery("simple", b.c.lexeme)
    )
    joined = func.string_agg(literal("(") + cast(pair, Text) + literal(")"), literal(" | "))
    return (
        select(cast(joined, TSQUERY))
        .select_from(a)
        .join(b, a.c.lexeme < b.c.lexeme)
        .where(a.c.n <= PAIRED_WORDS, b.c.n <= PAIRED_WORDS)  # pairs grow as the square
        .scalar_subquery()
    )


def ranked_matches(
    episodes: Any,
    query: Any,
    filters: Sequence[ColumnElement[bool] | TextClause],
    n: int,
    cap: int | None = TEXT_CAP,
    bounded: list[str] | None = None,
) -> Select[Any]:
    """``id, occurred_at, importance_score, rank`` of at most ``n`` of the ``episodes`` (the
    table or an alias of it) under ``filters`` matching any word of ``query``, best
    ``ts_rank`` first; ``cap`` (None: no cap) bounds how many are ranked (module doc);
    ``bounded``: the words a long query is searched by (``worker.db.query_words.words_of``)."""
    c = episodes.c
    anyq = any_word(query, bounded)
    rank = func.ts_rank(c.search_vector, anyq).label("rank")
    columns = (c.id, c.occurred_at, c.importance_score, rank)
    if cap is None:
        return (
            select(*columns)
            .where(*filters, c.search_vector.op("@@")(anyq))
            .order_by(desc(rank), desc(c.occurred_at), c.id)
            .limit(n)
        )
    allq = all_words(query, bounded)
    limit: ColumnElement[int] = literal_column(str(int(cap)))  # a constant: the plan knows it
    parts = [
        select(*columns).where(*filters, c.search_vector.op("@@")(words)).limit(limit)
        for words in (allq, two_words(query, bounded), anyq)
    ]
    found = union(*parts).subquery("matched")
    m = found.c
    return (
        select(m.id, m.occurred_at, m.importance_score, m.rank)
        .order_by(desc(m.rank), desc(m.occurred_at), m.id)
        .limit(n)
    )
