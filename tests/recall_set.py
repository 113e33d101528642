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
