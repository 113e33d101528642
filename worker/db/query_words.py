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

How: a query of at most ``MAX_QUERY_WORDS // 2`` runs of letters and digits cannot have more
words than the bound (``surely_within``) and is searched as it always was, in one statement.
A longer one costs one round trip more: ``lexemes_sql`` picks its words, and the statement
gets them as values (``words_of``): the planner estimates its matches by them, and nothing is
computed per row (a ``tsquery`` built inside the statement made 32-128 word recalls ~3x
slower: BENCHMARKS.md).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from schemas.limits import MAX_QUERY_WORDS
from worker.db.models import SEARCH_CONFIG

__all__ = [
    "COMMON_SHARE",
    "MAX_QUERY_WORDS",
    "lexemes_sql",
    "surely_within",
    "tsquery_text",
    "words_of",
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


_RUN = re.compile(r"[^\W_]+")


def surely_within(query: str) -> bool:
    """Whether ``query`` has at most ``MAX_QUERY_WORDS // 2`` runs of letters and digits: then
    it has at most ``MAX_QUERY_WORDS`` words as Postgres indexes them (it makes at most two of
    each run: a hyphenated word's parts and whole, a URL's host and path), and it is searched
    by every word the way it always was (one statement, its words estimated by the planner).
    Counted up to the first run past that, whatever the query's length."""
    half = MAX_QUERY_WORDS // 2
    return sum(1 for _ in itertools.islice(_RUN.finditer(query), half + 1)) <= half


@dataclass(frozen=True)
class Words:
    """How a statement names the words a query is searched by: ``lexemes`` (``text[]``),
    ``any`` and ``all`` (``tsquery``) as SQL of the query ``:q``, with ``params``."""

    lexemes: str
    any: str
    all: str
    params: dict[str, Any]


_EVERY = Words(
    f"tsvector_to_array(to_tsvector('{SEARCH_CONFIG}', :q))",
    f"CAST(replace(CAST(plainto_tsquery('{SEARCH_CONFIG}', :q) AS text), '&', '|') AS tsquery)",
    f"plainto_tsquery('{SEARCH_CONFIG}', :q)",
    {},
)


async def words_of(conn: AsyncConnection, query: str, table: str) -> Words:
    """The words ``query`` is searched by in ``table``: a short query (``surely_within``) by
    all of them, read in the statement itself; a longer one by at most ``MAX_QUERY_WORDS``
    (``lexemes_sql``, one round trip more), passed to the statement as values, so the planner
    estimates by them and nothing is computed per row."""
    if surely_within(query):
        return _EVERY
    found = await conn.execute(text(f"SELECT {lexemes_sql(':q', table)}"), {"q": query})
    lexemes = list(found.scalar_one() or [])
    return Words(
        "CAST(:words AS text[])",
        "CAST(:any_words AS tsquery)",
        "CAST(:all_words AS tsquery)",
        {
            "words": lexemes,
            "any_words": tsquery_text(lexemes, "|"),
            "all_words": tsquery_text(lexemes, "&"),
        },
    )


def tsquery_text(lexemes: list[str], operator: str) -> str:
    """``lexemes`` as ``tsquery`` text joined by ``operator``, each quoted as Postgres quotes
    a lexeme (a quote doubled, a backslash escaped): no word can break the syntax."""
    quoted = ("'" + w.replace("\\", "\\\\").replace("'", "''") + "'" for w in lexemes)
    return f" {operator} ".join(quoted)
