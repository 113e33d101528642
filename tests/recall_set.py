"""The labeled recall set (``tests/data/recall_set.json``), for tests and ``bench/``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.episodes.remember import remember

RECALL_SET = Path(__file__).parent / "data" / "recall_set.json"


@dataclass(frozen=True, slots=True)
class LabeledEpisode:
    key: str
    task: str
    lessons: list[str]


@dataclass(frozen=True, slots=True)
class LabeledQuery:
    query: str
    expect: str


def load_recall_set() -> tuple[list[LabeledEpisode], list[LabeledQuery]]:
    data = json.loads(RECALL_SET.read_text())
    episodes = [LabeledEpisode(e["key"], e["task"], list(e["lessons"])) for e in data["episodes"]]
    queries = [LabeledQuery(q["query"], q["expect"]) for q in data["queries"]]
    return episodes, queries


async def remember_all(
    engine: AsyncEngine,
    redis: Redis,
    prefix: str,
    project: str,
    episodes: Sequence[LabeledEpisode],
) -> dict[str, str]:
    """Remember each labeled episode in ``project``; returns key → episode id."""
    ids = {}
    for e in episodes:
        done = await remember(
            engine,
            redis,
            prefix,
            project,
            e.key,
            task_description=e.task,
            lessons_learned=e.lessons,
        )
        ids[e.key] = str(done.episode_id)
    return ids


FILLER_EPISODES = """
INSERT INTO episodes (id, source_event_id, project_id, session_id, outcome, context_summary,
    importance_score, occurred_at, announced_at)
SELECT gen_random_uuid(), :project || '/filler-' || g, :project, 'filler-' || g, 'success',
    'filler', 0.5, now() - g * interval '1 second', now()
FROM generate_series(1, :n) g
"""
FILLER_VECTORS = """
WITH c AS MATERIALIZED (
    SELECT embedding, row_number() OVER () - 1 AS j FROM episode_embeddings
    WHERE project_id = :around)
INSERT INTO episode_embeddings (episode_id, project_id, model, dimension, embedding)
SELECT e.id, e.project_id, :model, :dimension,
    CASE WHEN c.embedding IS NULL THEN r.noise ELSE c.embedding + r.noise END
FROM (SELECT id, project_id, row_number() OVER () AS i FROM episodes
      WHERE project_id = :project AND session_id LIKE 'filler-%') e
CROSS JOIN LATERAL (
    SELECT CAST(array_agg((random() - 0.5 + 0 * d) * :spread * (0.3 + (e.i % 7) / 4.0))
        AS real[])::vector AS noise
    FROM generate_series(1, :dimension) d) r
LEFT JOIN c ON c.j = e.i % :centers
"""
"""The centers are read once (a ``MATERIALIZED`` CTE): read per row, their index scan walked the
rows this statement inserts when ``around`` is the filler's own project (a user tenant)."""


async def add_filler(
    engine: AsyncEngine,
    project: str,
    n: int,
    *,
    model: str,
    dimension: int = 384,
    around: str | None = None,
) -> None:
    """``n`` episodes of ``project`` with vectors of ``model`` written directly (no embedding):
    random directions, or, with ``around``, that project's vectors each moved by a random one
    of 0.3 to 1.8 times its length (cosine ~0.5-0.95 to it: other tenants' episodes on the
    same topics, the hard case for a filter applied after the HNSW scan)."""
    from sqlalchemy import text

    async with engine.begin() as conn:
        await conn.execute(text(FILLER_EPISODES), {"project": project, "n": n})
        centers = 1
        if around is not None:
            count = await conn.execute(
                text("SELECT count(*) FROM episode_embeddings WHERE project_id = :p"),
                {"p": around},
            )
            centers = max(1, int(count.scalar_one()))
        await conn.execute(
            text(FILLER_VECTORS),
            {
                "project": project,
                "model": model,
                "dimension": dimension,
                "around": around or "",
                "centers": centers,
                # uniform(-0.5, 0.5) has sd 0.289: times 1/(0.289 √dim) gives a unit length
                "spread": 1 / (0.2887 * dimension**0.5),
            },
        )


class Unused:
    """An embedder that must not be called: recall without vectors (no pgvector, or mode
    ``text``) embeds no query."""

    name = "unused"
    dimension = 3

    async def embed(self, texts: object) -> list[list[float]]:
        raise AssertionError("recall embedded a query although it cannot use vectors")
