"""The words a query is searched by, bounded: at most ``MAX_QUERY_WORDS`` distinct words.

Every words search (``Memory.recall``/``recall_scored``, ``EpisodeStore.recall``, the facts'
recall) matches any word of the query, and its work grows with the query's distinct words
(each is a GIN index entry to read and a lexeme to count in every match: ~0.3 ms a matched
word, so a 32 KiB query of distinct words cost seconds). So a query with more than
``MAX_QUERY_WORDS`` distinct words (lexemes: Postgres' English stems, stop words dropped) is
searched by that many of them, **common words last**: the words in the order the query says
them, except those Postgres' statistics of the table's words (``pg_stats.most_common_elems``,
kept by ``ANALYZE``) show in more than ``COMMON_SHARE`` of its rows, which come after all the
others, the most common last. A common word adds little to a match (BM25 weighs it least);
the statistics cannot tell a rare word from one the table lacks, so among the others the
query's order decides (a rarest-first order put every absent word before a rare one found in
a few turns). The query is not refused and not cut: the meaning half still embeds it whole
(to the model's window), and a query within the bound is searched by every word, as before.

One SQL expression, ``lexemes_sql``, gives the bounded words (``text[]``); ``any_of`` and
``all_of`` make the ``tsquery`` matching any or all of them. Each is one scalar subquery of
the statement (evaluated once, never per row).
"""

from __future__ import annotations

from schemas.limits import MAX_QUERY_WORDS
from worker.db.models import SEARCH_CONFIG

__all__ = [
    "COMMON_SHARE",
    "MAX_QUERY_WORDS",
    "all_of",
    "all_words_sql",
    "any_of",
    "any_words_sql",
    "lexemes_sql",
]

COMMON_SHARE = 0.05
"""A word the statistics show in more than this share of the table's rows is common."""

_COMMON = (
    "SELECT m.word, m.share FROM pg_stats p,"
    " unnest(CAST(CAST(p.most_common_elems AS text) AS text[]), p.most_common_elem_freqs)"
    " AS m(word, share)"
    " WHERE p.schemaname = current_schema() AND p.tablename = '{table}'"
    " AND p.attname = 'search_vector'"
)
"""The table's common words and the share of rows holding each (Postgres' statistics; none
before its first ``ANALYZE``)."""


def lexemes_sql(query: str, table: str) -> str:
    """SQL for the distinct words (``text[]``, in ``tsvector`` order) the text ``query`` (a SQL
    expression, e.g. ``:q``) is searched by in ``table`` (``episodes`` or ``facts``): all of
    them up to ``MAX_QUERY_WORDS``, else that many, common words last (module doc). The
    statistics are read only for a query past the bound."""
    if table not in ("episodes", "facts"):
        raise ValueError(f"no words search on {table!r}")
    bound = int(MAX_QUERY_WORDS)
    picked = (
        "SELECT w.lexeme FROM unnest(v) w"
        f" LEFT JOIN ({_COMMON.format(table=table)}) c ON c.word = w.lexeme"
        f" ORDER BY CASE WHEN c.share > {COMMON_SHARE} THEN c.share ELSE 0 END,"
        f" w.positions[1], w.lexeme LIMIT {bound}"
    )
    return (
        f"(SELECT CASE WHEN length(v) <= {bound} THEN tsvector_to_array(v)"
        f" ELSE tsvector_to_array(array_to_tsvector(ARRAY({picked}))) END"
        f" FROM to_tsvector('{SEARCH_CONFIG}', {query}) AS v)"
    )


def _within(query: str) -> str:
    return f"length(to_tsvector('{SEARCH_CONFIG}', {query})) <= {int(MAX_QUERY_WORDS)}"


def any_words_sql(query: str, table: str) -> str:
    """SQL: the ``tsquery`` matching any word of the text ``query`` (a SQL expression) that
    the search uses (``lexemes_sql``). A query within the bound is the expression the planner
    reads the words of (``plainto_tsquery``: it estimates the matches by them); a longer one,
    a scalar subquery evaluated once."""
    words = f"plainto_tsquery('{SEARCH_CONFIG}', {query})"
    return (
        f"(CASE WHEN {_within(query)} THEN CAST(replace(CAST({words} AS text), '&', '|')"
        f" AS tsquery) ELSE (SELECT {any_of(lexemes_sql(query, table))}) END)"
    )


def all_words_sql(query: str, table: str) -> str:
    """SQL: the ``tsquery`` matching all the words ``any_words_sql`` matches any of."""
    return (
        f"(CASE WHEN {_within(query)} THEN plainto_tsquery('{SEARCH_CONFIG}', {query})"
        f" ELSE (SELECT {all_of(lexemes_sql(query, table))}) END)"
    )


def _joined(lexemes: str, operator: str) -> str:
    # The words as a tsvector's text ('a' 'b''s' ...: each quoted and escaped by Postgres),
    # joined by the operator: a word cannot break the tsquery's syntax.
    return (
        f"CAST(replace(CAST(strip(array_to_tsvector({lexemes})) AS text), ''' ''',"
        f" ''' {operator} ''') AS tsquery)"
    )


def any_of(lexemes: str) -> str:
    """SQL: the ``tsquery`` matching any of ``lexemes`` (a ``text[]`` expression)."""
    return _joined(lexemes, "|")


def all_of(lexemes: str) -> str:
    """SQL: the ``tsquery`` matching all of ``lexemes`` (a ``text[]`` expression)."""
    return _joined(lexemes, "&")
