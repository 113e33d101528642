"""Fact extraction (``Memory.consolidate``): a pluggable extractor over episodes not yet
consolidated, each exactly once in effect.

An extractor has LoomFlow's ``Consolidator`` shape: ``async consolidate(episodes, *, store)``
appends the facts it finds to ``store`` (our ``FactStore``). So LoomFlow's own LLM-backed
``Consolidator(model=...)`` plugs in as it is; ``LessonsExtractor`` needs no model.

**Once.** ``run_extractor`` takes a batch of unconsolidated episodes with ``FOR UPDATE SKIP
LOCKED`` (two runs never take the same ones), runs the extractor, marks them
(``episodes.consolidated_at``) and commits. A crash or an extractor error leaves them
unmarked, to be taken again; what the extractor appended before is not doubled, because the
same claim twice is one fact (``facts``). The mark is durable: restarts never re-extract.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.ids import is_valid_write_id
from worker.user_memory.facts import FactStore
from worker.user_memory.models import Episode, Fact
from worker.user_memory.turns import EPISODE_COLUMNS, SessionEpisode, episode_from_row

BATCH = 100
OUTCOME_CONFIDENCE = {"success": 0.9, "partial": 0.7, "failure": 0.6, "abandoned": 0.5}


class Extractor(Protocol):
    """LoomFlow's ``Consolidator`` shape."""

    async def consolidate(self, episodes: Iterable[Episode], *, store: Any) -> list[Any]: ...


_SLUG = re.compile(r"[^a-z0-9]+")


class LessonsExtractor:
    """Turns a finished session's lessons into facts about its agent type, no LLM needed.

    Each lesson of a session episode whose spawn named an agent type becomes
    ``Fact(subject="agent_type:<type>", predicate="lesson_<words>_<hash>", object=<lesson>)``
    for the session's user, valid from when the session ended, sourced from the episode,
    confident by outcome (success 0.9, partial 0.7, failure 0.6, abandoned 0.5). The
    predicate is the lesson's own (its first words and a hash), so lessons accumulate
    instead of superseding each other, and the same lesson learned again is the same fact.
    Turns are skipped.
    """

    async def consolidate(self, episodes: Iterable[Episode], *, store: Any) -> list[Fact]:
        facts = [fact for episode in episodes for fact in self.facts_of(episode)]
        if facts:
            await store.append_many(facts)
        return facts

    @staticmethod
    def facts_of(episode: Episode) -> list[Fact]:
        if not isinstance(episode, SessionEpisode) or not episode.agent_type_id:
            return []
        out = []
        for lesson in episode.lessons_learned:
            lesson = lesson.strip()
            if not lesson:
                continue
            words = "_".join(_SLUG.sub(" ", lesson.lower()).split()[:5])
            digest = hashlib.sha1(lesson.encode()).hexdigest()[:8]
            out.append(
                Fact(
                    user_id=episode.user_id,
                    subject=f"agent_type:{episode.agent_type_id}",
                    predicate=f"lesson_{words}_{digest}",
                    object=lesson,
                    confidence=OUTCOME_CONFIDENCE.get(episode.outcome or "", 0.5),
                    valid_from=episode.occurred_at,
                    sources=[episode.id],
                )
            )
        return out


_TAKE = text(
    f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE project_id = :p AND consolidated_at IS NULL"
    " ORDER BY occurred_at, id LIMIT :n FOR UPDATE SKIP LOCKED"
)
_MARK = text("UPDATE episodes SET consolidated_at = now() WHERE id = ANY(:ids)")


async def run_extractor(
    engine: AsyncEngine, project_id: str, extractor: Extractor, store: Any, batch: int = BATCH
) -> int:
    """Consolidate the project's unconsolidated episodes, a batch at a time; how many."""
    done = 0
    while True:
        async with engine.begin() as conn:
            rows = (await conn.execute(_TAKE, {"p": project_id, "n": batch})).all()
            if not rows:
                return done
            await extractor.consolidate([episode_from_row(r) for r in rows], store=store)
            await conn.execute(_MARK, {"ids": [r.id for r in rows]})
        done += len(rows)
        if len(rows) < batch:
            return done


def same_claims_merged(facts: list[Fact]) -> list[Fact]:
    """One fact per claim (user, subject, predicate, object) of a batch: the earliest valid
    from, every source (as appending them one by one would leave them, in one write)."""
    merged: dict[tuple[object, ...], Fact] = {}
    for fact in sorted(facts, key=lambda f: f.valid_from):
        key = (fact.user_id, fact.subject, fact.predicate, fact.object)
        if (first := merged.get(key)) is None:
            merged[key] = fact
        else:
            first.sources = list(dict.fromkeys([*first.sources, *fact.sources]))
    return list(merged.values())


_TAKE_SESSIONS = text(
    f"SELECT project_id, {EPISODE_COLUMNS} FROM episodes"
    " WHERE consolidated_at IS NULL AND turn_id IS NULL"
    " ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED"
)


async def extract_session_lessons(engine: AsyncEngine, batch: int = 500) -> tuple[int, set[str]]:
    """The consolidator's pass: lessons of finished sessions (of every project) not yet
    consolidated become facts (``LessonsExtractor``); ``(episodes done, projects with new
    facts)``. One batch per call; the partial index ``ix_episodes_unconsolidated_sessions``
    finds them. Marking an episode is a non-HOT update (the index's condition changes): one
    per session episode, in batches, off the hot path."""
    extractor = LessonsExtractor()
    async with engine.begin() as conn:
        rows = (await conn.execute(_TAKE_SESSIONS, {"n": batch})).all()
        if not rows:
            return 0, set()
        by_project: dict[str, list[Fact]] = {}
        for row in rows:
            # A session an older version stored under a project or user "..": no facts (no
            # write names them), marked all the same, so it never holds up the others.
            if not is_valid_write_id(row.project_id) or not (
                row.user_id is None or is_valid_write_id(row.user_id)
            ):
                continue
            facts = extractor.facts_of(episode_from_row(row))
            if facts:
                by_project.setdefault(row.project_id, []).extend(facts)
        for project_id, facts in by_project.items():
            await FactStore(engine, project_id).append_many(same_claims_merged(facts))
        await conn.execute(_MARK, {"ids": [r.id for r in rows]})
    return len(rows), set(by_project)
