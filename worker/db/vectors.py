"""Episode vectors (pgvector): one row per episode and model, the dimension stored with it.

``episode_embeddings.embedding`` is an unconstrained ``vector``, so a change of model (another
dimension) needs no migration. The key is ``(episode_id, model)``: an episode may hold one
vector per model, so ``memworker reindex`` with a new model writes the new vectors beside the
old ones (recall by the old model keeps working meanwhile) and deletes the old ones only once
every episode has its new one (``worker.episodes.vectorising.reindex``). An HNSW index needs a
fixed dimension, so there is one *partial expression* index per dimension in use
(``(embedding::vector(384)) WHERE dimension = 384``), as pgvector's README suggests for
mixed dimensions; queries use the same expression and condition to reach it.

The table lives outside ``worker.db.models.Base``: it exists only where the ``vector`` extension
could be enabled. Where it cannot (a PostgreSQL without pgvector), everything else migrates,
``memworker migrate`` says in one line what to install, and recall falls back to full-text.
Query vectors travel as pgvector's text form (``'[0.1,0.2]'``), stored ones as a flat ``real[]``
(``store_vectors``), so no driver codec is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

VECTOR_TABLE = "episode_embeddings"


def missing_pgvector(server_version: tuple[int | str, ...] | None) -> str:
    """One line: pgvector is missing, recall falls back to full text, and what to install for
    this server's major version (``dialect.server_version_info``; PostgreSQL 16 when unknown)."""
    major = server_version[0] if server_version else 16
    return (
        "pgvector is not installed on this PostgreSQL server: recall uses full-text search only"
        " (install it: https://github.com/pgvector/pgvector#installation, e.g. the"
        f" postgresql-{major}-pgvector package for this PostgreSQL {major}, or the"
        " pgvector/pgvector image, then run memworker migrate)"
    )


CREATE_TABLE = f"""
CREATE TABLE IF NOT EXISTS {VECTOR_TABLE} (
    episode_id uuid NOT NULL REFERENCES episodes (id) ON DELETE CASCADE,
    project_id text NOT NULL,
    model text NOT NULL,
    dimension integer NOT NULL,
    embedding vector NOT NULL,
    embedded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {VECTOR_TABLE}_pkey PRIMARY KEY (episode_id, model)
)"""
KEY_BY_MODEL = f"""
DO $$ BEGIN
  IF (SELECT array_length(conkey, 1) FROM pg_constraint
      WHERE conrelid = '{VECTOR_TABLE}'::regclass AND contype = 'p') = 1 THEN
    ALTER TABLE {VECTOR_TABLE} DROP CONSTRAINT {VECTOR_TABLE}_pkey,
      ADD CONSTRAINT {VECTOR_TABLE}_pkey PRIMARY KEY (episode_id, model);
  END IF;
END $$"""
"""A table made when the key was ``episode_id`` alone gets ``(episode_id, model)`` (its key
index is rebuilt once, by ``memworker migrate``); a no-op after."""

CHUNK_TABLE = "episode_chunk_embeddings"
CREATE_CHUNK_TABLE = f"""
CREATE TABLE IF NOT EXISTS {CHUNK_TABLE} (
    episode_id uuid NOT NULL REFERENCES episodes (id) ON DELETE CASCADE,
    model text NOT NULL,
    chunk integer NOT NULL,
    project_id text NOT NULL,
    dimension integer NOT NULL,
    embedding vector NOT NULL,
    PRIMARY KEY (episode_id, model, chunk)
)"""
"""The vectors of a long turn output's chunks (``worker.episodes.embedding.output_chunks``),
beside the turn's own vector in ``episode_embeddings``: more than one vector per turn, so the
whole turn is searchable by meaning. Deleted with the episode (``ON DELETE CASCADE``: forget
and erasure delete episodes), replaced with the turn's vector (``store_chunk_vectors``)."""
CREATE_CHUNK_INDEX = (
    f"CREATE INDEX IF NOT EXISTS ix_{CHUNK_TABLE}_project_model"
    f" ON {CHUNK_TABLE} (project_id, model)"
)
CREATE_PROJECT_INDEX = (
    f"CREATE INDEX IF NOT EXISTS ix_{VECTOR_TABLE}_project_model"
    f" ON {VECTOR_TABLE} (project_id, model)"
)


def hnsw_index_name(dimension: int) -> str:
    return f"ix_{VECTOR_TABLE}_hnsw_{int(dimension)}"


def hnsw_index_sql(dimension: int) -> str:
    return (
        f"CREATE INDEX IF NOT EXISTS {hnsw_index_name(dimension)} ON {VECTOR_TABLE}"
        f" USING hnsw ((embedding::vector({int(dimension)})) vector_cosine_ops)"
        f" WHERE dimension = {int(dimension)}"
    )


def vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def parse_vector(literal: str) -> list[float]:
    return [float(x) for x in literal.strip("[]").split(",") if x]


def pgvector_available(conn: Connection) -> bool:
    """True when the ``vector`` extension is installed or can be (the server ships it)."""
    row = conn.execute(text("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")).first()
    return row is not None


def create_vector_schema(conn: Connection, dimension: int) -> str | None:
    """Enable ``vector`` and create the table and its indexes. Idempotent. Returns None when
    done, else one line saying why not (the server has no pgvector, or this role may not
    enable it); then nothing was changed."""
    if not pgvector_available(conn):
        return missing_pgvector(conn.dialect.server_version_info)
    try:
        with conn.begin_nested():
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
    except DBAPIError as exc:
        first = str(exc.orig or exc).splitlines()[0]
        return (
            f"pgvector could not be enabled ({first}): a superuser must run"
            " CREATE EXTENSION vector; then run memworker migrate again"
        )
    conn.execute(text(CREATE_TABLE))
    conn.execute(text(KEY_BY_MODEL))
    conn.execute(text(CREATE_PROJECT_INDEX))
    conn.execute(text(hnsw_index_sql(dimension)))
    conn.execute(text(CREATE_CHUNK_TABLE))
    conn.execute(text(CREATE_CHUNK_INDEX))
    return None


async def has_vector_table(conn: AsyncConnection) -> bool:
    row = (await conn.execute(text("SELECT to_regclass(:t)"), {"t": VECTOR_TABLE})).first()
    return row is not None and row[0] is not None


INSUFFICIENT_PRIVILEGE = "42501"


async def ensure_dimension_index(conn: AsyncConnection, dimension: int) -> str | None:
    """The HNSW index of ``dimension`` (a model with another dimension needs its own), created
    when it is missing. Returns None when it is there, else one line saying why not: only the
    table's owner may create an index, and the runtime role (the indexer's) is not the owner.
    Recall still works without it (exact scans), just slower on a large project."""
    present = await conn.execute(text("SELECT to_regclass(:i)"), {"i": hnsw_index_name(dimension)})
    if present.scalar_one() is not None:
        return None
    try:
        async with conn.begin_nested():
            await conn.execute(text(hnsw_index_sql(dimension)))
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != INSUFFICIENT_PRIVILEGE:
            raise
        return (
            f"no vector index for {int(dimension)}-dimension vectors and this role may not create"
            f" it ({str(exc.orig).splitlines()[0]}): run memworker migrate as the schema owner"
            " with the same MEMWORKER_EMBEDDING_* settings; recall scans exactly until then"
        )
    return None


UPSERT = f"""
INSERT INTO {VECTOR_TABLE} (episode_id, project_id, model, dimension, embedding)
SELECT e.id, e.project_id, :model, CAST(:dimension AS integer),
    CAST((CAST(:flat AS real[]))[(v.n - 1) * :dimension + 1 : v.n * :dimension] AS vector)
FROM unnest(CAST(:ids AS uuid[])) WITH ORDINALITY AS v(id, n)
JOIN episodes e ON e.id = v.id
ON CONFLICT (episode_id, model) DO UPDATE
SET dimension = excluded.dimension, embedding = excluded.embedding, embedded_at = now()
WHERE {VECTOR_TABLE}.dimension IS DISTINCT FROM excluded.dimension
   OR {VECTOR_TABLE}.embedding IS DISTINCT FROM excluded.embedding
"""
"""Store vectors of existing episodes (an episode forgotten meanwhile is skipped); a vector
already there from the same model and equal is left alone, so redelivery (or the indexer after
``Memory.remember`` embedded the turn itself) writes nothing; another model's stays beside it.

The vectors travel as one flat ``real[]`` (asyncpg sends it binary), the i-th its i-th slice:
formatting and parsing 384 floats as text per vector cost more than the HNSW insert's share of
the indexer's Python and Postgres time (BENCHMARKS.md). ``real`` is what a ``vector`` stores, so
nothing is rounded that the text form kept."""


async def store_vectors(
    conn: AsyncConnection,
    model: str,
    dimension: int,
    ids: Sequence[str],
    vectors: Sequence[Sequence[float]],
) -> None:
    flat: list[float] = []
    for vector in vectors:
        if len(vector) != dimension:
            raise ValueError(f"a vector of {len(vector)} dimensions, expected {dimension}")
        flat.extend(vector)
    await conn.execute(
        text(UPSERT),
        {"model": model, "dimension": dimension, "ids": list(ids), "flat": flat},
    )


async def has_chunk_table(conn: AsyncConnection) -> bool:
    """Whether ``memworker migrate`` has made the chunks' table (a schema migrated before it
    keeps one vector per episode until then)."""
    row = (await conn.execute(text("SELECT to_regclass(:t)"), {"t": CHUNK_TABLE})).first()
    return row is not None and row[0] is not None


STORE_CHUNKS = f"""
INSERT INTO {CHUNK_TABLE} (episode_id, model, chunk, project_id, dimension, embedding)
SELECT e.id, :model, v.chunk, e.project_id, CAST(:dimension AS integer),
    CAST((CAST(:flat AS real[]))[(v.n - 1) * :dimension + 1 : v.n * :dimension] AS vector)
FROM unnest(CAST(:ids AS uuid[]), CAST(:chunks AS integer[])) WITH ORDINALITY AS v(id, chunk, n)
JOIN episodes e ON e.id = v.id
"""


async def store_chunk_vectors(
    conn: AsyncConnection,
    model: str,
    dimension: int,
    episode_ids: Sequence[str],
    chunks: Sequence[tuple[str, int, Sequence[float]]],
) -> None:
    """Replace the chunk vectors of ``model`` of ``episode_ids`` with ``chunks`` (episode id,
    chunk number, vector): an episode re-embedded keeps no chunk of its old text."""
    await conn.execute(
        text(
            f"DELETE FROM {CHUNK_TABLE} WHERE model = :model"
            " AND episode_id = ANY(CAST(:ids AS uuid[]))"
        ),
        {"model": model, "ids": list(episode_ids)},
    )
    if not chunks:
        return
    flat: list[float] = []
    for _id, _n, vector in chunks:
        if len(vector) != dimension:
            raise ValueError(f"a vector of {len(vector)} dimensions, expected {dimension}")
        flat.extend(vector)
    await conn.execute(
        text(STORE_CHUNKS),
        {
            "model": model,
            "dimension": dimension,
            "ids": [c[0] for c in chunks],
            "chunks": [c[1] for c in chunks],
            "flat": flat,
        },
    )


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic's ``include_name`` hook: the models (``Base``) do not describe the vector table
    (it exists only with pgvector), so comparing them with a database leaves it out."""
    return not (type_ == "table" and name in (VECTOR_TABLE, CHUNK_TABLE))

    return not (type_ == "table" and name == VECTOR_TABLE)


DROP_OTHER_MODELS = f"""
DELETE FROM {VECTOR_TABLE} o USING {VECTOR_TABLE} n
WHERE n.episode_id = o.episode_id AND n.model = :model AND o.model <> :model
  AND (CAST(:project AS text) IS NULL OR o.project_id = :project)
"""
DROP_OTHER_MODELS_CHUNKS = f"""
DELETE FROM {CHUNK_TABLE} o USING {VECTOR_TABLE} n
WHERE n.episode_id = o.episode_id AND n.model = :model AND o.model <> :model
  AND (CAST(:project AS text) IS NULL OR o.project_id = :project)
"""


async def drop_other_models(conn: AsyncConnection, model: str, project_id: str | None) -> int:
    """Delete the vectors of other models of every episode (of ``project_id``, or all) that has
    one of ``model``: the last step of a reindex to a new model, so an episode is never left
    without a vector; how many were deleted."""
    arguments = {"model": model, "project": project_id}
    await conn.execute(text(DROP_OTHER_MODELS_CHUNKS), arguments)  # its long outputs' chunks
    result = await conn.execute(text(DROP_OTHER_MODELS), arguments)
    return int(getattr(result, "rowcount", 0) or 0)
