"""The words half of recall (``EpisodeStore.recall``, ``Memory.recall_scored``): the episodes
matching any word of the query, ranked by ``ts_rank``, with a bounded cost.

**Why a cap.** Any word of the query matches, so a query with a common word matches a share of
the whole store: ~3,500-10,500 of 100k episodes for the labeled queries in
``bench/recall_latency.py``, ~10x that at 1M. Ranking them all (reading each matching row from
the heap, then ``ts_rank``) cost 10-67 ms at 100k, most of a recall's time, and grows with the
store. So at most ``cap`` matches are ranked (``TEXT_CAP``): the GIN index still finds every
match (a bitmap, cheap), but only the first ``cap`` rows the scan reads are ranked, plus every
episode holding **all** the query's words (at most ``cap`` more; GIN intersects the words, so
this stays small), which are the ones ``ts_rank`` puts first. The query's words are at most
``MAX_QUERY_WORDS``, common words last (``worker.db.query_words``): a longer query costs no
more than that. A scope with at most ``cap``
matches is ranked exactly as without a cap. Above it, an episode sharing only some of the
query's common words may be missed by this search (the vector search still finds it by
meaning); BENCHMARKS.md has the measured cost and the labeled recall either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Text,
    case,
    cast,
    column,
    desc,
    func,
    literal,
    literal_column,
    select,
    text,
    union,
)
from sqlalchemy.dialects.postgresql import ARRAY, TSQUERY
from sqlalchemy.sql.elements import TextClause

from schemas.limits import MAX_QUERY_WORDS
from worker.db.models import SEARCH_CONFIG
from worker.db.query_words import all_of, any_of, lexemes_sql

TEXT_CAP = 1_000
"""Default of ``EpisodeStore(text_cap=)``: how many matches of any word are ranked at most."""

BY_INDEX = "SET LOCAL enable_seqscan = off"
"""Run before ``ranked_matches`` with a cap (in its transaction): with a ``LIMIT`` the planner
may read the table in order and stop at the cap, which its estimate of the matches makes look
cheap (measured: a seq scan of the whole 10k table per tier, 12 ms against 5 ms by the GIN
index, and one that stops only after ~8% of 100k rows); the GIN index bounds it either way."""
UNSET_BY_INDEX = "SET LOCAL enable_seqscan TO DEFAULT"


def _once(sql: str, query: Any, kind: Any) -> ColumnElement[Any]:
    """``sql`` (of the bound ``:words_of``, the query) as a scalar subquery: evaluated once for
    the statement, never per row."""
    selected = text(f"SELECT {sql} AS found").bindparams(words_of=query)
    return selected.columns(column("found", kind)).scalar_subquery()


def _within(query: Any) -> ColumnElement[bool]:
    return func.length(func.to_tsvector(SEARCH_CONFIG, query)) <= MAX_QUERY_WORDS


def query_lexemes(query: Any) -> ColumnElement[Any]:
    """The distinct words the query is searched by (``text[]``): at most ``MAX_QUERY_WORDS``,
    common words last (``worker.db.query_words``). Within the bound, the expression the
    planner reads the words of (it estimates the matches by them); past it, a subquery."""
    every = func.tsvector_to_array(func.to_tsvector(SEARCH_CONFIG, query))
    bounded = _once(lexemes_sql(":words_of", "episodes"), query, ARRAY(Text))
    return case((_within(query), every), else_=bounded)


def any_word(query: Any) -> ColumnElement[Any]:
    """The query's words joined by OR: an episode sharing some of them matches."""
    words = func.plainto_tsquery(SEARCH_CONFIG, query)
    every = cast(func.replace(cast(words, Text), "&", "|"), TSQUERY)
    bounded = _once(any_of(lexemes_sql(":words_of", "episodes")), query, TSQUERY)
    return case((_within(query), every), else_=bounded)


def all_words(query: Any) -> ColumnElement[Any]:
    """The query's words joined by AND: an episode holding every one of them matches."""
    every = func.plainto_tsquery(SEARCH_CONFIG, query)
    bounded = _once(all_of(lexemes_sql(":words_of", "episodes")), query, TSQUERY)
    return case((_within(query), every), else_=bounded)


PAIRED_WORDS = 12
"""``two_words`` pairs at most this many of the query's distinct words (66 pairs): a query of
n words has n(n-1)/2 pairs, and ``MAX_QUERY_WORDS`` would make 8,128."""


def two_words(query: Any) -> ColumnElement[Any]:
    """Any two of the query's words (``(a & b) | (a & c) | ...``; NULL, matching nothing, for
    a query of one word; of a longer query, pairs of its first ``PAIRED_WORDS`` distinct words
    in the order Postgres sorts them). Each word goes through ``plainto_tsquery('simple',
    ...)`` and the pairs are joined as the text form Postgres itself writes, so no word can
    break the syntax."""
    lexemes = query_lexemes(query)
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
) -> Select[Any]:
    """``id, occurred_at, importance_score, rank`` of at most ``n`` of the ``episodes`` (the
    table or an alias of it) under ``filters`` matching any word of ``query``, best
    ``ts_rank`` first; ``cap`` (None: no cap) bounds how many are ranked (module doc)."""
    c = episodes.c
    anyq = any_word(query)
    rank = func.ts_rank(c.search_vector, anyq).label("rank")
    columns = (c.id, c.occurred_at, c.importance_score, rank)
    if cap is None:
        return (
            select(*columns)
            .where(*filters, c.search_vector.op("@@")(anyq))
            .order_by(desc(rank), desc(c.occurred_at), c.id)
            .limit(n)
        )
    allq = all_words(query)
    limit: ColumnElement[int] = literal_column(str(int(cap)))  # a constant: the plan knows it
    parts = [
        select(*columns).where(*filters, c.search_vector.op("@@")(words)).limit(limit)
        for words in (allq, two_words(query), anyq)
    ]
    found = union(*parts).subquery("matched")
    m = found.c
    return (
        select(m.id, m.occurred_at, m.importance_score, m.rank)
        .order_by(desc(m.rank), desc(m.occurred_at), m.id)
        .limit(n)
    )
