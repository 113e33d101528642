"""The vector half of ``EpisodeStore.recall``: the query's embedding, the nearest episodes of one
project (exact or HNSW), and the cosine similarity of any episode to the query.

**Small tenants among big ones.** pgvector 0.6 applies ``WHERE project_id = ...`` *after* the
HNSW scan: the index yields its ``hnsw.ef_search`` nearest vectors of the whole store and the
filter keeps the project's, so a project holding 50 of 100k vectors gets about
``ef_search × 50 / 100k`` of them back: fewer than asked for, usually none. So a project (with
the recall's filters: user, agent type, outcome, time) that has at most ``exact_below``
vectors of the model is searched **exactly**: its rows (reached by the ``(project_id, model)``
index and the episodes' filters) are ordered by ``distance + 0``, an expression the HNSW index
cannot serve, so every row's distance is computed (a top-N sort: 17 ms at 10k vectors on 2
busy cores, where a ``MATERIALIZED`` CTE of the rows, as before, spilled ~15 MB to disk and
took 26 ms). Above that size HNSW is used (``ef_search`` at least the number of candidates).
How many vectors a scope has is counted up to ``exact_below + 1`` (an index-only scan,
bounded) and kept ``count_ttl_s`` seconds (``bench/small_tenant_recall.py`` measures recall@3
either way: BENCHMARKS.md).

**Similarity** is the cosine similarity of the two vectors, ``1 - (a <=> b)``: -1..1, 1 for the
same direction (this model's unrelated texts land near 0..0.2, paraphrases above ~0.5).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Integer,
    Select,
    Text,
    bindparam,
    cast,
    column,
    func,
    literal,
    select,
    table,
    text,
)
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.types import UserDefinedType

from worker.db.models import Episode
from worker.db.vectors import VECTOR_TABLE, has_vector_table, missing_pgvector, vector_literal
from worker.episodes.embedding import Embedder, EmbeddingError
from worker.episodes.ranking import Candidate
from worker.logs import get_logger

log = get_logger("worker.episodes.store")

EXACT_BELOW = 10_000
"""Default of ``MEMWORKER_RECALL_EXACT_BELOW``: a scope with at most this many vectors is
searched exactly (~10-20 ms at 10k vectors of 384 dimensions on 2 cores)."""
COUNT_TTL_S = 30.0


class Vector(UserDefinedType[Any]):
    """pgvector's ``vector`` (``vector(n)`` with a dimension), for casts only."""

    cache_ok = True

    def __init__(self, dimension: int | None = None) -> None:
        self.dimension = dimension

    def get_col_spec(self, **_kw: Any) -> str:
        return "vector" if self.dimension is None else f"vector({int(self.dimension)})"


def _vectors() -> Any:
    return table(
        VECTOR_TABLE,
        column("episode_id", PG_UUID(as_uuid=True)),
        column("project_id", Text),
        column("model", Text),
        column("dimension", Integer),
        column("embedding", Vector()),
    ).alias("v")


@dataclass(slots=True)
class Nearest:
    """The nearest episodes, best first, with their similarity; ``exact``: how they were found."""

    candidates: list[Candidate] = field(default_factory=list)
    similarity: dict[str, float] = field(default_factory=dict)
    exact: bool = False


class BoundedCounts:
    """How many rows a scope has, counted up to ``bound + 1`` (so the count stays cheap however
    large the scope) and kept ``ttl_s`` seconds per key: the vector search's and the words
    search's "is this scope small?"."""

    def __init__(self, engine: AsyncEngine, bound: int, ttl_s: float) -> None:
        self.engine = engine
        self.bound = bound
        self.ttl_s = ttl_s
        self._counts: dict[Hashable, tuple[float, int]] = {}

    async def count(self, key: Hashable, rows: Select[Any]) -> int:
        """The rows of ``rows`` (a select of the scope's rows), at most ``bound + 1``."""
        now = time.monotonic()
        cached = self._counts.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        bounded = rows.limit(self.bound + 1).subquery()
        async with self.engine.connect() as conn:
            size = int((await conn.execute(select(func.count()).select_from(bounded))).scalar_one())
        if len(self._counts) > 10_000:
            self._counts.clear()
        self._counts[key] = (now + self.ttl_s, size)
        return size


class VectorSearch:
    """Embeds queries with ``embedder`` and searches ``episode_embeddings`` of its model."""

    def __init__(
        self,
        engine: AsyncEngine,
        embedder: Embedder | None,
        *,
        exact_below: int = EXACT_BELOW,
        count_ttl_s: float = COUNT_TTL_S,
    ) -> None:
        self.engine = engine
        self.embedder = embedder
        self.exact_below = exact_below
        self.count_ttl_s = count_ttl_s
        self._counts = BoundedCounts(engine, exact_below, count_ttl_s)
        self._table: bool | None = None
        self._warned: set[str] = set()

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    async def query_vector(self, query: str) -> list[float] | None:
        """The query's embedding; None (said once) without an embedder, pgvector, or when the
        embedding server does not answer: recall then uses words only."""
        if self.embedder is None:
            self.warn_once("no_embedder", "recall has no embedder: full-text search only")
            return None
        if self._table is None:
            async with self.engine.connect() as conn:
                self._table = await has_vector_table(conn)
        if not self._table:
            self.warn_once("no_pgvector", missing_pgvector(self.engine.dialect.server_version_info))
            return None
        try:
            [vector] = await self.embedder.embed([query])
        except EmbeddingError as exc:  # an outage of the embedding server: words still work
            self.warn_once("embedder_down", f"recall uses full-text only: {exc}")
            return None
        return list(vector)

    def _distance(self, embedding: Any, vector: Sequence[float]) -> ColumnElement[float]:
        assert self.embedder is not None
        query = cast(cast(bindparam("q", vector_literal(vector), type_=Text), Text), Vector())
        return cast(embedding, Vector(self.embedder.dimension)).op("<=>", return_type=Float)(query)

    def _mine(self, v: Any) -> list[ColumnElement[bool]]:
        assert self.embedder is not None
        return [v.c.model == self.embedder.name, v.c.dimension == self.embedder.dimension]

    async def scope_size(
        self, project_id: str, filters: list[ColumnElement[bool]], scope: Hashable
    ) -> int:
        """How many vectors of the model the scope has, up to ``exact_below + 1`` (cached)."""
        v = _vectors()
        rows = (
            select(literal(1))
            .select_from(v.join(Episode, Episode.id == v.c.episode_id))
            .where(v.c.project_id == project_id, *self._mine(v), *filters)
        )
        return await self._counts.count((scope, self.embedder.name if self.embedder else ""), rows)

    async def nearest(
        self,
        project_id: str,
        vector: Sequence[float],
        filters: list[ColumnElement[bool]],
        n: int,
        scope: Hashable,
    ) -> Nearest:
        """The scope's ``n`` episodes nearest to ``vector``: exactly when the scope has at
        most ``exact_below`` vectors, else by the HNSW index."""
        exact = await self.scope_size(project_id, filters, scope) <= self.exact_below
        v = _vectors()
        distance = self._distance(v.c.embedding, vector)
        statement = (
            select(
                v.c.episode_id,
                Episode.occurred_at,
                Episode.importance_score,
                (1 - distance).label("similarity"),
            )
            .join(Episode, Episode.id == v.c.episode_id)
            .where(v.c.project_id == project_id, *self._mine(v), *filters)
        )
        if exact:  # ordered by an expression the HNSW index cannot serve: every row's distance
            distance = distance + 0
        statement = statement.order_by(distance).limit(n)
        found = Nearest(exact=exact)
        async with self.engine.begin() as conn:
            if not exact:
                await conn.execute(text(f"SET LOCAL hnsw.ef_search = {min(1000, max(40, n))}"))
            for row in await conn.execute(statement):
                found.candidates.append(Candidate(str(row[0]), row[1], row[2]))
                found.similarity[str(row[0])] = float(row[3])
            if not found.candidates and not await self._project_has_vectors(conn, project_id):
                assert self.embedder is not None
                self.warn_once(
                    f"no_vectors:{project_id}",
                    f"project {project_id} has no {self.embedder.name} vectors yet: recall uses"
                    " full-text only until `memworker index` (or `memworker reindex`) embeds them",
                )
        return found

    async def similarities(
        self, project_id: str, vector: Sequence[float], episode_ids: Sequence[str]
    ) -> dict[str, float]:
        """The similarity of each of ``episode_ids`` that has a vector of the model."""
        if not episode_ids:
            return {}
        v = _vectors()
        statement = select(v.c.episode_id, 1 - self._distance(v.c.embedding, vector)).where(
            v.c.episode_id.in_([_uuid(i) for i in episode_ids]),
            v.c.project_id == project_id,
            *self._mine(v),
        )
        async with self.engine.connect() as conn:
            return {str(r[0]): float(r[1]) for r in await conn.execute(statement)}

    def similarity_of(self, episode_id: Any, vector: Sequence[float]) -> Any:
        """A scalar subquery: the similarity of ``episode_id``'s vector of the model to
        ``vector`` (NULL when it has none), to select beside the episode's row."""
        v = _vectors()
        return (
            select(1 - self._distance(v.c.embedding, vector))
            .where(v.c.episode_id == episode_id, *self._mine(v))
            .scalar_subquery()
        )

    async def _project_has_vectors(self, conn: Any, project_id: str) -> bool:
        row = await conn.execute(
            text(f"SELECT 1 FROM {VECTOR_TABLE} WHERE project_id = :p AND model = :m LIMIT 1"),
            {"p": project_id, "m": self.embedder.name if self.embedder else ""},
        )
        return row.first() is not None


def _uuid(value: str) -> Any:
    import uuid

    return uuid.UUID(value)
