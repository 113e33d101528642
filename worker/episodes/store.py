"""The long-term memory API: episodes and lifecycle history in Postgres, per project.

Every call takes a ``project_id`` and every query filters on it: nothing here can read or remove
another project's rows. Forgetting and exporting (erasure) are ``worker.erasure.export``'s.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Hashable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar

from redis.asyncio import Redis
from sqlalchemy import (
    ColumnElement,
    Select,
    desc,
    func,
    literal,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from schemas.inputs import check_limit, check_text, check_when
from schemas.limits import MAX_QUERY_BYTES
from worker.db.models import SEARCH_CONFIG, Episode, LifecycleEvent
from worker.db.query_words import words_of
from worker.episodes.embedding import Embedder
from worker.episodes.ranking import DEFAULT_WEIGHTS, Candidate, RecallWeights, fuse
from worker.episodes.text_search import BY_INDEX, TEXT_CAP, ranked_matches
from worker.episodes.vector_search import (
    COUNT_TTL_S,
    EXACT_BELOW,
    BoundedCounts,
    Nearest,
    VectorSearch,
)
from worker.erasure.export import ProjectExport, export_project
from worker.erasure.forget import DEFAULT_MARKER_TTL_MS, ForgetResult, forget_project
from worker.ids import validate_id
from worker.logs import get_logger

log = get_logger("worker.episodes.store")
RecallMode = Literal["hybrid", "text", "vector"]

_Row = TypeVar("_Row")


@dataclass(frozen=True, slots=True)
class SearchHit:
    episode: Episode
    rank: float


def _episode_filters(
    project_id: str,
    session_id: str | None,
    agent_instance_id: str | None,
    agent_type_id: str | None,
    outcome: str | None,
    since: datetime | None,
    until: datetime | None,
    user_id: str | None = None,
) -> list[ColumnElement[bool]]:
    filters: list[ColumnElement[bool]] = [Episode.project_id == project_id]
    if user_id is not None:
        filters.append(Episode.user_id == user_id)
    if session_id is not None:
        filters.append(Episode.session_id == session_id)
    if agent_instance_id is not None:
        filters.append(Episode.agent_instance_id == agent_instance_id)
    if agent_type_id is not None:
        filters.append(Episode.agent_type_id == agent_type_id)
    if outcome is not None:
        filters.append(Episode.outcome == outcome)
    if since is not None:
        filters.append(Episode.occurred_at >= since)
    if until is not None:
        filters.append(Episode.occurred_at < until)
    return filters


@dataclass(frozen=True, slots=True)
class RecallHit:
    """An episode ``recall`` found: ``score`` orders the hits, ``relevance`` (0..1) is the
    fused rank alone (both relative to the other hits: the best is near 1.0 however poor the
    match). ``similarity`` is absolute: the cosine similarity of the query's vector and the
    episode's, -1..1 (None when the episode has no vector of the model yet or recall ran
    without vectors); threshold it with ``recall(min_score=)``. The ranking's components:
    ``vector_rank``/``text_rank`` are its places in each search and ``text_score`` its
    ``ts_rank`` (None when that search did not find it)."""

    episode: Episode
    score: float
    relevance: float
    vector_rank: int | None
    text_rank: int | None
    similarity: float | None = None
    text_score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        e = self.episode
        return {
            "episode_id": str(e.id),
            "project_id": e.project_id,
            "session_id": e.session_id,
            "user_id": e.user_id,
            "agent_type_id": e.agent_type_id,
            "task_description": e.task_description,
            "outcome": e.outcome,
            "lessons_learned": e.lessons_learned,
            "occurred_at": e.occurred_at.isoformat(),
            "importance_score": e.importance_score,
            "score": round(self.score, 6),
            "similarity": None if self.similarity is None else round(self.similarity, 6),
            "relevance": round(self.relevance, 6),
            "vector_rank": self.vector_rank,
            "text_rank": self.text_rank,
            "text_score": None if self.text_score is None else round(self.text_score, 6),
            "turn_id": e.turn_id,  # a turn of user memory: what it said (null for a session's)
            "input": e.input,
            "output": e.output,
        }


async def _none() -> list[Any]:
    return []


async def _no_vector() -> tuple[None, Nearest]:
    return None, Nearest()


class EpisodeStore:
    """Read and forget what the consolidator stored; every method is scoped by project.

    ``embedder`` (``episodes.embedding``) is what ``recall`` embeds queries with; without one,
    or without pgvector, ``recall`` ranks by full-text only (and says so once). A scope of at
    most ``exact_below`` vectors is searched exactly (``episodes.vector_search``); at most
    ``text_cap`` of the episodes matching a word of the query are ranked by the full-text
    search (``episodes.text_search``; None: all of them).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        embedder: Embedder | None = None,
        *,
        exact_below: int = EXACT_BELOW,
        text_cap: int | None = TEXT_CAP,
    ) -> None:
        self.engine = engine
        self.embedder = embedder
        self.text_cap = text_cap
        self._episode_counts = BoundedCounts(engine, exact_below, COUNT_TTL_S)
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self.vectors = VectorSearch(engine, embedder, exact_below=exact_below)

    # -- reading -------------------------------------------------------------------------------

    async def list_episodes(
        self,
        project_id: str,
        *,
        session_id: str | None = None,
        agent_instance_id: str | None = None,
        agent_type_id: str | None = None,
        outcome: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 50,
        offset: int = 0,
        user_id: str | None = None,
    ) -> list[Episode]:
        """The project's episodes, newest first, filtered by whatever is given (``user_id``:
        only the sessions whose spawn named that user)."""
        filters = _episode_filters(
            project_id, session_id, agent_instance_id, agent_type_id, outcome, since, until, user_id
        )
        query = (
            select(Episode)
            .where(*filters)
            .order_by(desc(Episode.occurred_at), Episode.id)
            .limit(max(0, limit))
            .offset(max(0, offset))
        )
        return await self._all(query)

    async def get_episode(self, project_id: str, episode_id: uuid.UUID | str) -> Episode | None:
        try:
            key = episode_id if isinstance(episode_id, uuid.UUID) else uuid.UUID(episode_id)
        except ValueError:
            return None
        rows = await self._all(
            select(Episode).where(Episode.project_id == project_id, Episode.id == key)
        )
        return rows[0] if rows else None

    async def search(
        self, project_id: str, query: str, limit: int = 10, *, user_id: str | None = None
    ) -> list[SearchHit]:
        """Full-text search (web-search syntax: ``"exact phrase" -without or``), best first;
        with ``user_id``, only that user's episodes."""
        tsquery = func.websearch_to_tsquery(SEARCH_CONFIG, query)
        rank = func.ts_rank(Episode.search_vector, tsquery).label("rank")
        mine = [] if user_id is None else [Episode.user_id == user_id]
        statement = (
            select(Episode, rank)
            .where(Episode.project_id == project_id, Episode.search_vector.op("@@")(tsquery), *mine)
            .order_by(desc(rank), desc(Episode.occurred_at), Episode.id)
            .limit(max(0, limit))
        )
        async with self._sessions() as session:
            rows = (await session.execute(statement)).all()
        return [SearchHit(episode, float(score)) for episode, score in rows]

    async def recall(
        self,
        project_id: str,
        query: str,
        limit: int = 10,
        *,
        session_id: str | None = None,
        agent_instance_id: str | None = None,
        agent_type_id: str | None = None,
        outcome: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        weights: RecallWeights = DEFAULT_WEIGHTS,
        mode: RecallMode = "hybrid",
        user_id: str | None = None,
        min_score: float | None = None,
    ) -> list[RecallHit]:
        """The project's episodes most relevant to ``query``, best first (``episodes.ranking``
        says how they are ranked). ``mode`` ``"text"`` or ``"vector"`` uses one search only.

        Filters (both searches, before ranking): ``user_id`` (the episodes of sessions whose
        spawn named that user), ``agent_type_id``, ``agent_instance_id``, ``session_id``,
        ``outcome``, and the time the episode occurred: ``since`` (inclusive) to ``until``
        (exclusive). Mode ``"text"`` does not embed the query (so its hits carry no
        similarity) unless ``min_score`` is given.

        ``min_score`` (-1..1) keeps only the hits whose ``similarity`` (cosine of the query's
        and the episode's vectors) is at least that, before ``limit`` applies. A hit with no
        similarity (its episode has no vector yet, or recall has no vectors: no embedder, no
        pgvector, the embedding server down) is **dropped** too: a threshold asks for proven
        matches, so recall without vectors returns nothing then (and logs why once)."""
        validate_id(project_id, "project_id")
        if user_id is not None:
            validate_id(user_id, "user_id")
        check_text(query, "query", MAX_QUERY_BYTES)  # the input rule (schemas.inputs)
        check_limit(limit)
        for field, when in (("since", since), ("until", until)):
            if when is not None:
                check_when(when, field)
        filters = _episode_filters(
            project_id, session_id, agent_instance_id, agent_type_id, outcome, since, until, user_id
        )
        scope = (
            project_id,
            user_id,
            session_id,
            agent_instance_id,
            agent_type_id,
            outcome,
            since,
            until,
        )
        n = max(limit, weights.candidates)
        wants_vector = mode != "text" or min_score is not None
        searches: list[Awaitable[Any]] = [
            self._vector_search(project_id, query, filters, n, scope, mode)
            if wants_vector
            else _no_vector()
        ]
        searches.append(
            self._text_candidates(query, filters, n, scope) if mode != "vector" else _none()
        )
        # the text search runs while the query embeds
        (query_vector, nearest), text_found = await asyncio.gather(*searches)
        texts: list[tuple[Candidate, float]] = text_found
        found = [nearest.candidates, [c for c, _rank in texts]]
        candidates = {c.episode_id: c for ranked in found for c in ranked}
        lists = [[c.episode_id for c in ranked] for ranked in found]
        fused = fuse(lists, candidates, weights)
        similarity = dict(nearest.similarity)
        if min_score is not None:
            if query_vector is not None:
                missing = [i for i, _s, _r in fused if i not in similarity]
                similarity.update(
                    await self.vectors.similarities(project_id, query_vector, missing)
                )
            fused = [f for f in fused if similarity.get(f[0], -2.0) >= min_score]
        best = fused[: max(0, limit)]
        if not best:
            return []
        episodes = await self._load_best(
            project_id, [i for i, _s, _r in best], query_vector, similarity
        )
        vector_rank = {i: r for r, i in enumerate(lists[0], start=1)}
        text_rank = {i: r for r, i in enumerate(lists[1], start=1)}
        text_score = {c.episode_id: rank for c, rank in texts}
        return [
            RecallHit(
                episodes[i],
                score,
                relevance,
                vector_rank.get(i),
                text_rank.get(i),
                similarity.get(i),
                text_score.get(i),
            )
            for i, score, relevance in best
            if i in episodes  # forgotten meanwhile
        ]

    async def _load_best(
        self,
        project_id: str,
        ids: list[str],
        query_vector: list[float] | None,
        similarity: dict[str, float],
    ) -> dict[str, Episode]:
        """The chosen episodes by id, in one round trip with the similarity of those the vector
        search did not return (found by words only), which is added to ``similarity``."""
        unknown = query_vector is not None and any(i not in similarity for i in ids)
        columns: list[Any] = [Episode]
        if unknown:
            assert query_vector is not None
            columns.append(self.vectors.similarity_of(Episode.id, query_vector))
        statement = select(*columns).where(
            Episode.project_id == project_id, Episode.id.in_([uuid.UUID(i) for i in ids])
        )
        episodes: dict[str, Episode] = {}
        async with self._sessions() as session:
            for row in await session.execute(statement):
                key = str(row[0].id)
                episodes[key] = row[0]
                if unknown and row[1] is not None:
                    similarity.setdefault(key, float(row[1]))
        return episodes

    async def _vector_search(
        self,
        project_id: str,
        query: str,
        filters: list[ColumnElement[bool]],
        n: int,
        scope: tuple[Any, ...],
        mode: RecallMode,
    ) -> tuple[list[float] | None, Nearest]:
        """The query's vector (None without vectors) and, unless ``mode`` is ``"text"``,
        the scope's nearest episodes."""
        vector = await self.vectors.query_vector(query)
        if vector is None or mode == "text":
            return vector, Nearest()
        return vector, await self.vectors.nearest(project_id, vector, filters, n, scope)

    async def _text_candidates(
        self, query: str, filters: list[ColumnElement[bool]], n: int, scope: Hashable
    ) -> list[tuple[Candidate, float]]:
        cap = await self._words_cap(filters, scope)
        async with self.engine.begin() as conn:
            searched = await words_of(conn, query, "episodes")  # at most MAX_QUERY_WORDS
            bounded = searched.params.get("words")
            statement = ranked_matches(Episode.__table__, query, filters, n, cap, bounded)
            if cap is not None:
                await conn.execute(text(BY_INDEX))
            return [
                (Candidate(str(r[0]), r[1], r[2]), float(r[3]))
                for r in await conn.execute(statement)
            ]

    async def _words_cap(self, filters: list[ColumnElement[bool]], scope: Hashable) -> int | None:
        """``text_cap``, or None (every match ranked) for a scope of at most ``exact_below``
        episodes: there ranking every match reads at most that many rows, one query, cheaper
        than the capped search's three (measured at 10k: 5.1 against 16.2 ms p50). Counted as
        the vector search counts its scope (``BoundedCounts``)."""
        if self.text_cap is None:
            return None
        rows = select(literal(1)).select_from(Episode).where(*filters)
        small = await self._episode_counts.count(scope, rows) <= self._episode_counts.bound
        return None if small else self.text_cap

    async def session_history(self, project_id: str, session_id: str) -> list[LifecycleEvent]:
        """Every result of one session, in the order they happened."""
        return await self._all(
            select(LifecycleEvent)
            .where(LifecycleEvent.project_id == project_id, LifecycleEvent.session_id == session_id)
            .order_by(
                LifecycleEvent.occurred_at,
                LifecycleEvent.seq.asc().nulls_last(),
                LifecycleEvent.recorded_at,
                LifecycleEvent.event_id,
            )
        )

    # -- forgetting and exporting: ``worker.erasure.export`` ----------------------------------

    async def forget(
        self,
        project_id: str,
        *,
        session_id: str | None = None,
        before: datetime | None = None,
        redis: Redis | None = None,
        prefix: str | None = None,
        dry_run: bool = False,
        marker_ttl_ms: int = DEFAULT_MARKER_TTL_MS,
        shards: int | None = None,
        user_id: str | None = None,
        anonymous_user: bool = False,
        since: datetime | None = None,
    ) -> ForgetResult:
        """Forget the project (a session, the history before a time; a user's data only, with
        ``user_id``, or the data of no user, with ``anonymous_user``) everywhere memworker
        keeps it: ``forget_project``, the code ``memworker forget`` runs; ``result.receipt``
        says what went where."""
        return await forget_project(
            self.engine,
            project_id,
            session_id=session_id,
            before=before,
            redis=redis,
            prefix=prefix,
            dry_run=dry_run,
            marker_ttl_ms=marker_ttl_ms,
            shards=shards,
            user_id=user_id,
            anonymous_user=anonymous_user,
            since=since,
        )

    async def export(
        self,
        project_id: str,
        *,
        session_id: str | None = None,
        before: datetime | None = None,
        redis: Redis | None = None,
        prefix: str | None = None,
        user_id: str | None = None,
        anonymous_user: bool = False,
    ) -> ProjectExport:
        """Everything ``forget`` with the same arguments would remove: ``export_project``."""
        return await export_project(
            self.engine,
            project_id,
            session_id=session_id,
            before=before,
            redis=redis,
            prefix=prefix,
            user_id=user_id,
            anonymous_user=anonymous_user,
        )

    # -- internals -------------------------------------------------------------------------------

    async def _all(self, statement: Select[_Row]) -> list[_Row]:
        async with self._sessions() as session:
            return list((await session.scalars(statement)).all())
