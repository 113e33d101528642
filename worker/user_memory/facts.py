"""Bi-temporal facts (``facts``): LoomFlow's ``FactStore`` on Postgres, one per project.

``append`` follows LoomFlow's valid-time supersession (Zep/Graphiti's rule): a stored fact of
the same user, subject and predicate with a different object whose validity overlaps the new
one's is closed where the new one begins (or, when the new one is an older, backfilled claim,
the new one is closed where the stored one begins). Nothing is deleted: history stays.

Where LoomFlow leaves a choice, a shared durable store takes these:

- **The same claim twice is one fact.** Appending a fact whose user, subject, predicate and
  object match a stored fact whose validity overlaps (or touches) the new one returns the
  stored fact's id; its sources gain the new ones and it is valid from the earlier of the two
  starts. No row is added, so an extractor that runs again, in any order, adds nothing.
- **A fact is history, never rewritten.** Appending an id already stored with another claim
  raises ``FactConflictError`` and changes nothing (LoomFlow's dict replaced it): a changed
  belief is a new fact, which supersedes the old.

Appends of one (user, subject, predicate) are serialised by an advisory lock, so concurrent
writers never leave two facts valid at once for one predicate.

``recall_text`` ranks among the user's facts valid at ``valid_at`` (``recall_scored``: the
same, with each fact's scores; how they are ranked and scored: ``fact_ranking``):

- **by meaning** when the store has an embedder (``FactStore(embedder=...)``, LoomFlow's or
  ours): each appended fact's triple ("subject predicate object") is embedded and kept with it
  (``facts.embedding``, a plain ``float8[]``: no pgvector needed), and facts are ranked by the
  cosine to the query's vector, facts without a vector of that model left out, as LoomFlow
  does. With pgvector the cosine is taken in Postgres (``<=>`` on the stored array cast to
  ``vector``) over the user's candidate facts and only the nearest come back (with the words'
  candidates, for their cosine); without it, every candidate's vector is read and the cosine
  taken here. No index: a user's facts are few (hundreds, thousands); past ~10k per user
  this wants one;
- **by words and meaning** in a ``Memory`` without one: the indexer embeds every
  ``fact.added`` (``worker.episodes.indexer``, off the write path, no model in the writer's
  process), and once the project has such vectors, words (Postgres full text, English
  stemming, any word of the query) and meaning are fused, so a fact is found by its words as
  soon as it is appended and by its meaning once indexed;
- **by words** alone before that;
- an empty query gives the most recently recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from schemas.inputs import stored_when
from worker.db.query_words import words_of
from worker.db.vectors import vector_literal
from worker.episodes.changes import change_event, owe
from worker.ids import validate_write_id
from worker.user_memory.fact_embedding import embed_texts, model_name, triple_text
from worker.user_memory.fact_ranking import FUSED_CANDIDATES, by_cosine, cosines, rank_facts
from worker.user_memory.fact_ranking import cosine as cosine  # where it was first
from worker.user_memory.fact_ranking import fuse_facts as fuse_facts  # where it was first
from worker.user_memory.fact_supersession import FactConflictError as FactConflictError
from worker.user_memory.fact_supersession import (
    _claim,
    _overlap_or_touch,
    plan_supersession,
)
from worker.user_memory.inputs import check_fact
from worker.user_memory.models import (
    Fact,
    FactMatch,
    as_fact,
    as_utc,
    check_user_id,
    normalize_predicate,
    warn_isolation,
)

_COLUMNS = (
    "id, user_id, subject, predicate, object, confidence, valid_from, valid_until,"
    " recorded_at, sources"
)
_LOCK = text(
    "SELECT pg_advisory_xact_lock(hashtextextended("
    "'facts/' || :p || '/' || coalesce(CAST(:u AS text), '') || '/' || :s || '/' || :r, 0))"
)
_SAME_KEY = text(
    f"SELECT {_COLUMNS} FROM facts WHERE project_id = :p AND user_id IS NOT DISTINCT FROM :u"
    " AND subject = :s AND predicate = :r FOR UPDATE"
)
_CLOSE = text("UPDATE facts SET valid_until = :until WHERE project_id = :p AND id = :id")
_SET_SOURCES = text(
    "UPDATE facts SET sources = CAST(:src AS jsonb) WHERE project_id = :p AND id = :id"
)
MAX_SOURCES = 32
"""A fact names at most this many sources (the most recent): the same claim again adds its
source and drops the oldest past it."""
_BY_ID = text(f"SELECT {_COLUMNS} FROM facts WHERE project_id = :p AND id = :id FOR UPDATE")
_EXTEND = text("UPDATE facts SET valid_from = :vf WHERE project_id = :p AND id = :id")
_INSERT = text(
    f"INSERT INTO facts (project_id, {_COLUMNS}, embedding, embedding_model) VALUES (:p, :id,"
    " :u, :s, :r, :o, :c, :vf, :vu, :ra, CAST(:src AS jsonb), :vec, :model)"
    " ON CONFLICT (project_id, id) DO NOTHING RETURNING id"
)


def _user(user_id: str | None) -> str:
    check_user_id(user_id)
    return "user_id IS NULL" if user_id is None else "user_id = :u"


def fact_from_row(row: Row[Any]) -> Fact:
    return Fact(
        id=row.id,
        user_id=row.user_id,
        subject=row.subject,
        predicate=row.predicate,
        object=row.object,
        confidence=row.confidence,
        valid_from=stored_when(row.valid_from),
        valid_until=stored_when(row.valid_until),
        recorded_at=stored_when(row.recorded_at),
        sources=list(row.sources or []),
    )


class FactStore:
    """LoomFlow's ``FactStore`` protocol over the ``facts`` table of one project."""

    def __init__(
        self,
        engine: AsyncEngine,
        project_id: str,
        after_change: Any = None,
        *,
        embedder: Any = None,
        indexed_embedder: Any = None,
    ) -> None:
        self.engine = engine
        self.project_id = project_id
        self._after_change = after_change
        self.embedder = embedder
        """Embeds each fact as it is appended, and every query (LoomFlow's ``embedder=``)."""
        self.indexed_embedder = indexed_embedder
        """Gives the embedder the indexer embeds facts with (``Memory``: the settings'), or
        None: once facts of the project have its vectors, queries are embedded with it."""

    async def append(self, fact: Fact | Any) -> str:
        """Store ``fact`` (LoomFlow's ``Fact`` too), superseding what it contradicts; its id
        (the stored one when the same claim is there already)."""
        [fact_id] = await self.append_many([fact])
        return fact_id

    async def append_many(self, facts: Iterable[Fact | Any]) -> list[str]:
        """``append`` for each, in one transaction; their ids in order."""
        validate_write_id(self.project_id, "project_id")  # a store of ".." still forgets
        ids: list[str] = []
        batch = [check_fact(as_fact(f)) for f in facts]
        if not batch:
            return ids
        vectors: list[list[float] | None] = [None] * len(batch)
        if self.embedder is not None:  # outside the transaction: it may call a server
            vectors = list(await embed_texts(self.embedder, [triple_text(f) for f in batch]))
        async with self.engine.begin() as conn:
            for fact, vector in zip(batch, vectors, strict=True):
                ids.append(await self._append(conn, fact, vector))
        if self._after_change is not None:
            await self._after_change()
        return ids

    async def _append(self, conn: AsyncConnection, fact: Fact, vector: list[float] | None) -> str:
        key = {"p": self.project_id, "u": fact.user_id, "s": fact.subject, "r": fact.predicate}
        await conn.execute(_LOCK, key)
        taken = (await conn.execute(_BY_ID, {"p": self.project_id, "id": fact.id})).first()
        if taken is not None:
            stored_fact = fact_from_row(taken)
            if _claim(stored_fact) != _claim(fact):
                raise FactConflictError(
                    f"fact {fact.id!r} is already stored with other content; a fact is"
                    " history: append the new claim under a new id (it supersedes the old)"
                )
            await self._add_sources(conn, stored_fact, fact.sources)
            return stored_fact.id
        stored = [fact_from_row(r) for r in await conn.execute(_SAME_KEY, key)]
        for same in stored:
            if same.object != fact.object or not _overlap_or_touch(same, fact):
                continue
            # The same claim: one fact, valid from the earlier of the two, from both sources.
            if fact.valid_from < same.valid_from:
                await conn.execute(
                    _EXTEND, {"p": self.project_id, "id": same.id, "vf": fact.valid_from}
                )
            await self._add_sources(conn, same, fact.sources)
            return same.id
        closes, until = plan_supersession(fact, stored)
        events = []
        for stored_id, valid_until in closes.items():
            await conn.execute(
                _CLOSE, {"p": self.project_id, "id": stored_id, "until": valid_until}
            )
            events.append(
                change_event(
                    "fact.superseded",
                    self.project_id,
                    fact.user_id,
                    stored_id,
                    fact_id=stored_id,
                    superseded_by=fact.id,
                    valid_until=valid_until.isoformat(),
                )
            )
        await conn.execute(
            _INSERT,
            {
                **key,
                "id": fact.id,
                "o": fact.object,
                "c": float(fact.confidence),
                "vf": fact.valid_from,
                "vu": until,
                "ra": fact.recorded_at,
                "src": orjson.dumps(fact.sources[-MAX_SOURCES:]).decode(),
                "vec": vector,
                "model": None if vector is None else model_name(self.embedder),
            },
        )
        events.insert(
            0, change_event("fact.added", self.project_id, fact.user_id, fact.id, fact_id=fact.id)
        )
        await owe(conn, self.project_id, events)
        return fact.id

    async def _add_sources(self, conn: AsyncConnection, stored: Fact, sources: list[str]) -> None:
        """The same claim again: its sources join the stored fact's, the most recent
        ``MAX_SOURCES`` kept (a lesson learned by a million sessions names the last ones)."""
        merged = list(dict.fromkeys([*stored.sources, *sources]))[-MAX_SOURCES:]
        if merged != stored.sources:
            await conn.execute(
                _SET_SOURCES,
                {"p": self.project_id, "id": stored.id, "src": orjson.dumps(merged).decode()},
            )

    async def query(
        self,
        *,
        subject: str | None = None,
        predicate: str | None = None,
        object_: str | None = None,
        valid_at: datetime | None = None,
        limit: int = 10,
        user_id: str | None = None,
    ) -> list[Fact]:
        """The user's facts matching every filter given, most recently recorded first."""
        where = ["project_id = :p", _user(user_id)]
        params: dict[str, Any] = {"p": self.project_id, "u": user_id, "n": max(0, limit)}
        for column, value in (("subject", subject), ("object", object_)):
            if value is not None:
                where.append(f"{column} = :{column}")
                params[column] = value
        if predicate is not None:
            where.append("predicate = :predicate")
            params["predicate"] = normalize_predicate(predicate)
        if valid_at is not None:
            where.append("valid_from <= :at AND (valid_until IS NULL OR valid_until > :at)")
            params["at"] = as_utc(valid_at)
        statement = text(
            f"SELECT {_COLUMNS} FROM facts WHERE {' AND '.join(where)}"
            " ORDER BY recorded_at DESC, id DESC LIMIT :n"
        )
        async with self.engine.connect() as conn:
            return [fact_from_row(r) for r in await conn.execute(statement, params)]

    async def recall_text(
        self,
        query: str,
        *,
        limit: int = 5,
        valid_at: datetime | None = None,
        user_id: str | None = None,
    ) -> list[Fact]:
        """The user's facts valid at ``valid_at`` best matching ``query``'s words."""
        found = await self._ranked(query, limit, valid_at, user_id, "recall_text")
        return [match.fact for match in found]

    async def recall_scored(
        self,
        query: str,
        *,
        limit: int = 5,
        valid_at: datetime | None = None,
        user_id: str | None = None,
    ) -> list[FactMatch]:
        """``recall_text``'s facts, in its order, each with its scores (``FactMatch``: the
        fused score that orders them, its cosine to the query, its words' rank)."""
        return await self._ranked(query, limit, valid_at, user_id, "recall_scored")

    async def _ranked(
        self,
        query: str,
        limit: int,
        valid_at: datetime | None,
        user_id: str | None,
        called: str,
    ) -> list[FactMatch]:
        if user_id is None and await self._has_named_users():
            warn_isolation(
                f"FactStore.{called} called without user_id, but the store contains facts for"
                " one or more named users; only anonymous facts are searched. Did you forget"
                " to pass user_id=?",
                stacklevel=4,  # the caller of Memory's method (or of this store's, one less)
            )
        where = ["project_id = :p", _user(user_id)]
        params: dict[str, Any] = {"p": self.project_id, "u": user_id, "n": max(0, limit)}
        if valid_at is not None:
            where.append("valid_from <= :at AND (valid_until IS NULL OR valid_until > :at)")
            params["at"] = as_utc(valid_at)
        if query.strip() and self.embedder is not None:
            nearest = await self._recall_by_meaning(self.embedder, query, where, params, [])
            return rank_facts(None, nearest, limit)
        by_words = await self._recall_by_words(query, where, params)
        indexed = await self._indexed_embedder() if query.strip() else None
        if indexed is None:
            return rank_facts(by_words, None, limit)
        found = [f.id for f, _rank in by_words]
        nearest = await self._recall_by_meaning(indexed, query, where, params, found)
        return rank_facts(by_words, nearest, limit)

    async def _recall_by_words(
        self, query: str, where: list[str], params: dict[str, Any]
    ) -> list[tuple[Fact, float | None]]:
        """The best ``FUSED_CANDIDATES`` facts holding a word of ``query``, with their
        ``ts_rank`` (an empty query: the most recently recorded, ranked None)."""
        where = list(where)
        async with self.engine.connect() as conn:
            if not query.strip():
                order, rank = "recorded_at DESC, id DESC", "NULL"
            else:
                searched = await words_of(conn, query, "facts")  # at most MAX_QUERY_WORDS
                where.append(f"search_vector @@ {searched.any}")
                rank = f"ts_rank(search_vector, {searched.any})"
                order = "word_rank DESC, length(subject || object), id"
                params = {**params, **searched.params, "q": query}
            statement = text(
                f"SELECT {_COLUMNS}, {rank} AS word_rank FROM facts WHERE {' AND '.join(where)}"
                f" ORDER BY {order} LIMIT {FUSED_CANDIDATES}"
            )
            return [
                (fact_from_row(r), None if r.word_rank is None else float(r.word_rank))
                for r in await conn.execute(statement, params)
            ]

    async def _indexed_embedder(self) -> Any:
        """The settings' embedder once the indexer has embedded facts of this project with it
        (``embed_facts``): then a query is embedded too and meaning joins words."""
        if self.indexed_embedder is None:
            return None
        embedder = self.indexed_embedder()
        if embedder is None:
            return None
        statement = text(
            "SELECT 1 FROM facts WHERE project_id = :p AND embedding_model = :m LIMIT 1"
        )
        async with self.engine.connect() as conn:
            found = await conn.execute(statement, {"p": self.project_id, "m": model_name(embedder)})
            return embedder if found.first() is not None else None

    async def _recall_by_meaning(
        self,
        embedder: Any,
        query: str,
        where: list[str],
        params: dict[str, Any],
        by_words: Sequence[str],
    ) -> list[tuple[Fact, float]]:
        """The candidates with a vector of ``embedder``'s model and their cosine to the
        query's, the most similar first: with pgvector, the nearest ``max(FUSED_CANDIDATES,
        limit)`` and the facts ``by_words`` found (the cosines taken in Postgres, no vector
        read here); without it, every one (the cosines taken here)."""
        [wanted] = await embed_texts(embedder, [query])
        params = {**params, "model": model_name(embedder)}
        async with self.engine.connect() as conn:
            if wanted and await _has_vector_type(conn):
                return await _nearest_in_postgres(conn, wanted, where, params, by_words)
            statement = text(
                f"SELECT {_COLUMNS}, embedding FROM facts WHERE {' AND '.join(where)}"
                " AND embedding_model = :model"
            )
            rows = (await conn.execute(statement, params)).all()
        similar = cosines(wanted, [r.embedding for r in rows])
        return by_cosine([(fact_from_row(r), c) for r, c in zip(rows, similar, strict=True)])

    async def _has_named_users(self) -> bool:
        statement = text(
            "SELECT 1 FROM facts WHERE project_id = :p AND user_id IS NOT NULL LIMIT 1"
        )
        async with self.engine.connect() as conn:
            return (await conn.execute(statement, {"p": self.project_id})).first() is not None

    async def all_facts(self) -> list[Fact]:
        """Every fact of the project, every user's, oldest recorded first."""
        statement = text(
            f"SELECT {_COLUMNS} FROM facts WHERE project_id = :p ORDER BY recorded_at, id"
        )
        async with self.engine.connect() as conn:
            return [fact_from_row(r) for r in await conn.execute(statement, {"p": self.project_id})]

    async def delete(self, *, user_id: str | None = None, before: datetime | None = None) -> int:
        """Remove the user's facts (those recorded before ``before``); how many."""
        async with self.engine.begin() as conn:
            return await delete_facts(conn, self.project_id, user_id, before)

    async def count(self, *, user_id: str | None = None) -> int:
        """How many facts the project holds about ``user_id`` (superseded ones included)."""
        statement = text(f"SELECT count(*) FROM facts WHERE project_id = :p AND {_user(user_id)}")
        async with self.engine.connect() as conn:
            return int(
                (await conn.execute(statement, {"p": self.project_id, "u": user_id})).scalar_one()
            )

    async def aclose(self) -> None:
        """Nothing to close: the ``Memory`` that made this store owns its connections."""


async def delete_facts(
    conn: AsyncConnection, project_id: str, user_id: str | None, before: datetime | None
) -> int:
    where = f"project_id = :p AND {_user(user_id)}"
    params: dict[str, Any] = {"p": project_id, "u": user_id}
    if before is not None:
        where += " AND recorded_at < :before"
        params["before"] = as_utc(before)
    rows = await conn.execute(text(f"DELETE FROM facts WHERE {where} RETURNING id"), params)
    return len(rows.all())


_VECTOR_TYPE: set[str] = set()
"""The databases (by URL) seen to have pgvector's ``vector`` type: checked again until one has
(``memworker migrate`` may enable it later)."""


async def _has_vector_type(conn: AsyncConnection) -> bool:
    """Whether pgvector is there: then a fact's cosine is taken in Postgres (``<=>`` on its
    ``float8[]`` cast to ``vector``), else here."""
    key = str(conn.engine.url)
    if key not in _VECTOR_TYPE and await conn.scalar(text(_VECTOR_TYPE_THERE)):
        _VECTOR_TYPE.add(key)
    return key in _VECTOR_TYPE


_VECTOR_TYPE_THERE = "SELECT to_regtype('vector') IS NOT NULL"
_COSINE = (
    "1 - coalesce(nullif(CAST(embedding AS vector) <=> (SELECT CAST(CAST(:qv AS text) AS vector)),"
    " 'NaN'), 1)"
)
"""A fact's cosine to the query's vector, taken by pgvector (over the vectors as ``real``:
the same as ``fact_ranking.cosines`` to ~1e-7); a zero vector's (pgvector's NaN) is 0.0, as
``cosines`` gives it. The query's vector is read once, in a sub-select: the driver prepares the
statement, and the generic plan Postgres keeps after five runs parsed its text once per fact
(1,000 facts: ~130 ms instead of ~16, BENCHMARKS.md, the memory inspector)."""


async def _nearest_in_postgres(
    conn: AsyncConnection,
    wanted: list[float],
    where: list[str],
    params: dict[str, Any],
    by_words: Sequence[str],
) -> list[tuple[Fact, float]]:
    """``FactStore._recall_by_meaning`` with pgvector: the nearest ``max(FUSED_CANDIDATES,
    limit)`` facts (ties by id, in code point order as ``by_cosine``) and those of
    ``by_words``, with their cosines; a vector of another dimension than the query's is left
    out (pgvector compares none)."""
    top = max(FUSED_CANDIDATES, int(params["n"]))
    statement = text(
        f"SELECT {_COLUMNS}, cosine FROM (SELECT {_COLUMNS}, cosine,"
        ' row_number() OVER (ORDER BY cosine DESC, id COLLATE "C") AS place'
        f" FROM (SELECT {_COLUMNS}, {_COSINE} AS cosine FROM facts"
        f" WHERE {' AND '.join(where)} AND embedding_model = :model"
        " AND cardinality(embedding) = :dimension) scored) ranked"
        " WHERE place <= :top OR id = ANY(CAST(:ids AS text[]))"
    )
    rows = await conn.execute(
        statement,
        {
            **params,
            "qv": vector_literal(wanted),
            "dimension": len(wanted),
            "top": top,
            "ids": list(by_words),
        },
    )
    return by_cosine([(fact_from_row(r), float(r.cosine)) for r in rows])


def facts_sorted(facts: Sequence[Fact]) -> list[Fact]:
    return sorted(facts, key=lambda f: (f.recorded_at, f.id))
