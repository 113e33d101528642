"""What the indexer (``worker.episodes.indexer``) and ``memworker reindex`` embed, and how
their vectors are stored: an episode's vector with its ``episode.recallable`` owed on the
change feed in one transaction (``worker.episodes.changes``), a fact's beside it.

Idempotent like the indexer: an episode that has a vector of the model is not read again, an
equal vector is never rewritten (``worker.db.vectors.store_vectors``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.erasures import NOT_ERASED
from worker.db.vectors import (
    VECTOR_TABLE,
    ensure_dimension_index,
    has_chunk_table,
    has_vector_table,
    missing_pgvector,
    store_chunk_vectors,
    store_vectors,
)
from worker.episodes.changes import change_event, owe_many
from worker.episodes.embedding import (
    Embedder,
    EmbeddingError,
    episode_text,
    fact_text,
    output_chunks,
)
from worker.logs import get_logger

log = get_logger("worker.episodes.vectorising")


@dataclass(frozen=True, slots=True)
class Embedded:
    """A batch's episodes without a vector (``SELECT_UNINDEXED`` rows), their vectors, and the
    vectors of their long outputs' chunks (episode id, chunk number, vector)."""

    rows: Sequence[Any]
    vectors: list[list[float]]
    chunks: list[tuple[str, int, list[float]]] = field(default_factory=list)


PREVIOUS_CHARS = 200
"""How much of the turn before it a turn's vector reads: on LoCoMo's tuning conversations the
turn with the one before it in its text lifted evidence recall (R@5 +.016, R@10 +.010,
BENCHMARKS.md) for about twice the tokens per short turn."""

SELECT_UNINDEXED = f"""
SELECT e.id::text AS id, e.project_id, e.user_id, e.turn_id,
    coalesce(e.task_description, e.input) AS task_description, e.lessons_learned,
    coalesce(e.output || E'\n', '') || e.context_summary AS context_summary,
    CASE WHEN e.turn_id IS NOT NULL THEN e.output END AS turn_output,
    CASE WHEN e.turn_id IS NOT NULL THEN (
        SELECT left(p.input, {PREVIOUS_CHARS}) FROM episodes p
        WHERE p.project_id = e.project_id AND p.session_id = e.session_id
          AND p.user_id IS NOT DISTINCT FROM e.user_id AND p.turn_id IS NOT NULL
          AND (p.occurred_at, p.recorded_at, p.id) < (e.occurred_at, e.recorded_at, e.id)
        ORDER BY p.occurred_at DESC, p.recorded_at DESC, p.id DESC LIMIT 1
    ) END AS previous_input
FROM episodes e
LEFT JOIN {VECTOR_TABLE} v ON v.episode_id = e.id AND v.model = :model
WHERE e.id = ANY(CAST(:ids AS uuid[])) AND v.episode_id IS NULL AND {NOT_ERASED}
"""
"""Episodes to embed (a turn as its input and output after the input of the turn before it
in its session, a long output in chunks too): announced, without a vector of the model, and
not covered by an erasure (``worker.db.erasures``: ``memworker forget`` deletes them; the
check keeps a replayed announcement from embedding anything it covers)."""


async def unindexed(engine: AsyncEngine, model: str, episode_ids: Sequence[str]) -> list[Any]:
    """The rows of ``SELECT_UNINDEXED``: the episodes of ``episode_ids`` to embed."""
    async with engine.connect() as conn:
        return list(
            (
                await conn.execute(
                    text(SELECT_UNINDEXED), {"model": model, "ids": list(episode_ids)}
                )
            ).all()
        )


def texts_of(rows: Sequence[Any]) -> list[str]:
    """What each row is embedded as: ``episode_text``, after the previous turn's input for a
    turn that has one (``PREVIOUS_CHARS``)."""
    texts = []
    for r in rows:
        own = episode_text(r.task_description, r.lessons_learned or [], r.context_summary)
        previous = getattr(r, "previous_input", None)
        texts.append(f"{previous}\n{own}" if previous else own)
    return texts


async def embed_rows(embedder: Embedder, rows: Sequence[Any]) -> Embedded:
    """The vectors of ``rows`` (``texts_of``) and of their outputs' chunks, in one call."""
    texts = texts_of(rows)
    chunked = [(r.id, n, t) for r in rows for n, t in enumerate(output_chunks(r.turn_output))]
    vectors = await embedder.embed(texts + [t for _id, _n, t in chunked])
    chunks = [(i, n, v) for (i, n, _t), v in zip(chunked, vectors[len(texts) :], strict=True)]
    return Embedded(rows, vectors[: len(texts)], chunks)


async def store_embedded(
    engine: AsyncEngine,
    embedder: Embedder,
    embedded: Embedded,
    projects: set[str] | None = None,
) -> int:
    """Store ``embedded``'s vectors, each owing an ``episode.recallable`` on the change feed
    (committed with its vector); ``projects`` collects whose are owed. How many."""
    rows = embedded.rows
    if not rows:
        return 0
    async with engine.begin() as conn:
        await store_vectors(
            conn, embedder.name, embedder.dimension, [r.id for r in rows], embedded.vectors
        )
        if await has_chunk_table(conn):
            await store_chunk_vectors(
                conn, embedder.name, embedder.dimension, [r.id for r in rows], embedded.chunks
            )
        elif embedded.chunks:
            log.warning("long outputs embedded whole only: run memworker migrate")
        await owe_many(
            conn,
            [
                (
                    row.project_id,
                    change_event(
                        "episode.recallable",
                        row.project_id,
                        row.user_id,
                        row.id,
                        episode_id=row.turn_id or row.id,
                        model=embedder.name,
                    ),
                )
                for row in rows
            ],
        )
    if projects is not None:
        projects.update(r.project_id for r in rows)
    return len(rows)


async def embed_and_store(
    engine: AsyncEngine,
    embedder: Embedder,
    episode_ids: Sequence[str],
    projects: set[str] | None = None,
) -> int:
    """Embed the episodes of ``episode_ids`` that have no vector of ``embedder``'s model and
    store them (``store_embedded``); returns how many were embedded."""
    rows = await unindexed(engine, embedder.name, episode_ids)
    if not rows:
        return 0
    return await store_embedded(engine, embedder, await embed_rows(embedder, rows), projects)


SELECT_UNEMBEDDED_FACTS = """
SELECT f.project_id, f.id, f.subject, f.predicate, f.object FROM facts f
JOIN unnest(CAST(:projects AS text[]), CAST(:ids AS text[])) AS w(project_id, id)
  ON f.project_id = w.project_id AND f.id = w.id
WHERE f.embedding_model IS DISTINCT FROM :model
"""
STORE_FACT_VECTOR = """
UPDATE facts SET embedding = :vector, embedding_model = :model
WHERE project_id = :project AND id = :id
"""


async def embed_facts(
    engine: AsyncEngine, embedder: Embedder, facts: Sequence[tuple[str, str]]
) -> int:
    """Embed the facts ``(project_id, fact_id)`` that have no vector of ``embedder``'s model
    (``facts.embedding``: what ``Memory.recall_facts`` ranks by meaning); how many. A fact
    forgotten meanwhile is simply not there."""
    params = {
        "projects": [p for p, _f in facts],
        "ids": [f for _p, f in facts],
        "model": embedder.name,
    }
    async with engine.connect() as conn:
        rows = (await conn.execute(text(SELECT_UNEMBEDDED_FACTS), params)).all()
    if not rows:
        return 0
    vectors = await embedder.embed([fact_text(r.subject, r.predicate, r.object) for r in rows])
    async with engine.begin() as conn:
        await conn.execute(
            text(STORE_FACT_VECTOR),
            [
                {"vector": list(v), "model": embedder.name, "project": r.project_id, "id": r.id}
                for r, v in zip(rows, vectors, strict=True)
            ],
        )
    return len(rows)


SELECT_STALE = f"""
SELECT e.id::text AS id FROM episodes e
LEFT JOIN {VECTOR_TABLE} v ON v.episode_id = e.id AND v.model = :model
WHERE v.episode_id IS NULL AND (CAST(:project AS text) IS NULL OR e.project_id = :project)
ORDER BY e.id LIMIT :limit
"""


async def reindex(
    engine: AsyncEngine,
    embedder: Embedder,
    *,
    project_id: str | None = None,
    batch_size: int = 256,
) -> int:
    """Embed every episode (of ``project_id``, or all) that has no vector of ``embedder``'s
    model (none, or only another model's: that one stays, ``worker.db.vectors``); returns how
    many. Safe to run next to the indexer (both upsert by episode id and model)."""
    async with engine.begin() as conn:
        if not await has_vector_table(conn):
            raise EmbeddingError(missing_pgvector(conn.dialect.server_version_info))
        why = await ensure_dimension_index(conn, embedder.dimension)
        if why is not None:
            log.warning(why)
    total = 0
    while True:
        async with engine.connect() as conn:
            ids = [
                row.id
                for row in await conn.execute(
                    text(SELECT_STALE),
                    {"model": embedder.name, "project": project_id, "limit": batch_size},
                )
            ]
        if not ids:
            return total
        done = await embed_and_store(engine, embedder, ids)
        if done == 0:  # pragma: no cover - forgotten meanwhile
            return total
        total += done
