"""``Memory``: LoomFlow 0.20's ``Memory`` protocol on memworker's Postgres and Redis.

Pinned blocks (``blocks``), one episode per turn (``turns``, ``recall``), bi-temporal facts
(``facts``), session continuity, a profile, export and forget, a pluggable fact extractor
(``extractors``); every change is published on the change feed (``changes``).
``user_id`` is a hard partition of blocks, episodes and facts; ``None`` is its own bucket (a
recall without it, where named users exist, warns ``IsolationWarning``, as LoomFlow does).
One ``Memory`` serves one project: nothing it does reads or removes another project's rows.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from datetime import datetime
from types import TracebackType
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.connections import client_for
from worker.db.engine import SecondConnections, create_database_engine
from worker.db.models import Episode as EpisodeRow
from worker.db.vectors import VECTOR_TABLE, has_vector_table
from worker.episodes.changes import change_event, owe
from worker.episodes.embedding import Embedder, embedder_from_settings
from worker.episodes.vector_search import VectorSearch
from worker.erasure.forget import forget_project
from worker.erasure.scope import InvalidForgetError, check_range
from worker.ids import validate_id
from worker.logs import get_logger
from worker.settings import Settings
from worker.user_memory import blocks, turns
from worker.user_memory.extractors import Extractor, run_extractor
from worker.user_memory.facts import FactStore
from worker.user_memory.indexing import TurnVectors, embed_query_or_none
from worker.user_memory.inputs import check_recall, check_recall_facts, check_session
from worker.user_memory.models import (
    Episode,
    Fact,
    FactMatch,
    MemoryBlock,
    MemoryExport,
    MemoryProfile,
    Message,
    ScoredMatches,
    as_utc,
    check_user_id,
    warn_isolation,
)
from worker.user_memory.recall import recall_scored
from worker.user_memory.writes import SharedWrites, TurnWriter, release, shared_writes

log = get_logger("worker.user_memory")

_CONSOLIDATING: ContextVar[bool] = ContextVar("memworker_consolidating", default=False)
"""Set while ``Memory.consolidate`` runs the extractor: what its appends owe is published once
its transaction (holding the episodes' rows) is over, not from inside it."""


class Memory:
    """A project's user memory (module doc). Usable as ``async with Memory("p") as memory``.

    ``settings``: connection settings as everywhere else (``MEMWORKER_*`` when omitted).
    ``consolidator``: the fact extractor ``consolidate()`` runs (LoomFlow's ``Consolidator``
    shape, or ``worker.user_memory.extractors.LessonsExtractor``); none: ``consolidate()`` does
    nothing. ``fact_store``: another LoomFlow ``FactStore`` to keep facts in (LoomFlow's
    argument; profile, export and forget then go through its methods). ``embedder``: what
    queries are embedded with for recall by meaning (default: the settings' model, loaded only
    once the project has vectors of it). ``engine``/``redis``: share connections you already
    have (then ``close`` leaves them open).
    """

    def __init__(
        self,
        project_id: str,
        *,
        settings: Settings | None = None,
        consolidator: Extractor | None = None,
        fact_store: Any | None = None,
        embedder: Embedder | None = None,
        engine: AsyncEngine | None = None,
        redis: Redis | RedisCluster | None = None,
    ) -> None:
        self.project_id = validate_id(project_id, "project_id")
        self.settings = settings or Settings()
        self._owned: list[Any] = []
        if engine is None:
            engine = create_database_engine(self.settings.database_url)
            self._owned.append(engine.dispose)
        if redis is None:  # only best-effort publishes: a stale connection is retried, an
            redis = client_for(self.settings, retry_seconds=0.5)  # outage is not waited out
            self._owned.append(redis.aclose)
        self.engine = engine
        self._second = SecondConnections.of(engine)  # recall's meaning half beside its words
        self.redis = redis
        self._consolidator = consolidator
        self._embedder = embedder
        self._default_embedder: Embedder | None = None
        self._vectors = False
        self._vector_search: VectorSearch | None = None
        self._turn_vectors = TurnVectors(
            engine, redis, self.settings, lambda: self._embedder or self._settings_embedder()
        )
        self._writes: SharedWrites | None = shared_writes(
            engine, redis, self.settings.stream_prefix, self.settings.shards
        )
        self._publisher = self._writes.publisher
        self._writer = TurnWriter(self.project_id, self._writes, self._turn_vectors)
        self.facts: Any = fact_store or FactStore(
            engine,
            self.project_id,
            after_change=self._flush_quietly,
            embedder=embedder,
            indexed_embedder=self._settings_embedder,
        )
        """LoomFlow's ``FactStore``: ours (the ``facts`` table) unless ``fact_store`` is given."""

    async def __aenter__(self) -> Memory:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Publish what the change feed still owes (best effort), then close the connections
        this memory opened."""
        await self._turn_vectors.close()
        try:
            await self.flush_changes()
        except Exception as exc:
            log.warning("change feed not flushed on close", error=str(exc).splitlines()[:1])
        if self._writes is not None:  # the last Memory of the engine stops its rounds
            writes, self._writes = self._writes, None
            await release(writes)
        for closer in reversed(self._owned):
            await closer()
        self._owned.clear()

    async def flush_changes(self) -> int:
        """Publish the project's owed change events (``changes``); how many."""
        return await self._publisher.flush(self.project_id)

    # -- working blocks ---------------------------------------------------------------------

    async def working(self, *, user_id: str | None = None) -> list[MemoryBlock]:
        """The user's pinned blocks, in pin order."""
        async with self.engine.connect() as conn:
            return await blocks.read_blocks(conn, self.project_id, user_id)

    async def update_block(self, name: str, content: str, *, user_id: str | None = None) -> None:
        """Replace a block's content (creating it in the next pin slot)."""
        await self._write_block(name, content, user_id, append=False)

    async def append_block(self, name: str, content: str, *, user_id: str | None = None) -> None:
        """Append to a block (creating it in the next pin slot); concurrent appends all land."""
        await self._write_block(name, content, user_id, append=True)

    async def _write_block(
        self, name: str, content: str, user_id: str | None, *, append: bool
    ) -> None:
        await blocks.write_block(
            self.engine,
            self.project_id,
            user_id,
            name,
            content,
            append=append,
            max_bytes=self.settings.max_value_bytes,
        )
        await self._flush_quietly()

    # -- episodes ---------------------------------------------------------------------------

    async def remember(self, episode: Episode | Any) -> str:
        """Store a turn (LoomFlow's ``Episode`` too), once; its id (``turns`` module doc).
        Recallable by meaning when it returns unless an indexer embeds it (``indexing``)."""
        return await self._writer.remember(episode)

    async def remember_many(self, episodes: Sequence[Episode | Any]) -> list[str]:
        """Store a batch of turns in one round trip, each once; their ids in order. A batch
        with a bad item is refused whole, nothing stored (``writes`` module doc)."""
        return await self._writer.remember_many(episodes)

    async def wait_recallable(self, ids: Sequence[str], *, timeout: float = 30.0) -> None:
        """Return once each of ``ids`` (remembered turns, or sessions' episodes) is recallable
        by meaning; ``indexing.NotRecallableError`` (a ``TimeoutError``) naming the others after
        ``timeout`` s; ``indexing.UnknownEpisodeError`` (a ``ValueError``) for ids never
        remembered. Needed only while an indexer embeds turns (``indexing`` module doc)."""
        await self._turn_vectors.wait_recallable(self.project_id, ids, timeout)

    async def recall(
        self,
        query: str,
        *,
        kind: str = "episodic",
        limit: int = 5,
        time_range: tuple[datetime, datetime] | None = None,
        user_id: str | None = None,
    ) -> list[Episode]:
        """The user's episodes best matching ``query`` (``recall_scored`` without scores)."""
        check_recall(query, limit, kind, time_range)
        matches = await self._recall(query, limit, time_range, user_id, 0.5)
        return [m.episode for m in matches]

    async def recall_scored(
        self,
        query: str,
        *,
        kind: str = "episodic",
        limit: int = 5,
        time_range: tuple[datetime, datetime] | None = None,
        user_id: str | None = None,
        alpha: float = 0.5,
    ) -> ScoredMatches:
        """The user's episodes best matching ``query`` with their scores (``recall`` module);
        ``.unindexed`` says how many it looked at had no vector yet (warned and counted)."""
        check_recall(query, limit, kind, time_range)
        return await self._recall(query, limit, time_range, user_id, alpha)

    async def _recall(
        self,
        query: str,
        limit: int,
        time_range: tuple[datetime, datetime] | None,
        user_id: str | None,
        alpha: float,
    ) -> ScoredMatches:
        if user_id is None and await self._has_named_users():
            warn_isolation(
                "Memory.recall called without user_id, but the store contains episodes for one"
                " or more named users. The anonymous bucket is partitioned from named-user"
                " buckets, so this query will only see anonymous episodes. Did you forget to"
                " pass user_id=?",
                stacklevel=3,
            )
        embedder = await self._query_embedder()
        embedding: asyncio.Future[list[float] | None] | None = None
        exact = False
        if embedder is not None and alpha > 0.0 and query.strip():
            # the query embeds (in a thread) while the words half reads its matches
            embedding = asyncio.ensure_future(embed_query_or_none(embedder, query))
            exact = await self._small_partition(embedder, user_id, time_range)
        try:
            async with self._second.maybe() as beside, self.engine.begin() as conn:
                matches = await recall_scored(
                    conn,
                    self.project_id,
                    query,
                    limit=limit,
                    time_range=time_range,
                    user_id=user_id,
                    alpha=alpha,
                    query_vector=None,
                    model=None if embedder is None else embedder.name,
                    exact=exact,
                    min_similarity=self.settings.recall_min_similarity,
                    embedding=embedding,
                    beside=beside,  # None: no slot free, the halves in turn
                )
        finally:
            if embedding is not None and not embedding.done():
                embedding.cancel()
        self._turn_vectors.report_unindexed(self.project_id, user_id, matches.unindexed)
        return matches

    async def _small_partition(
        self,
        embedder: Embedder,
        user_id: str | None,
        time_range: tuple[datetime, datetime] | None,
    ) -> bool:
        """Whether the partition (and time range) has at most ``recall_exact_below`` vectors:
        then it is searched exactly (``episodes.vector_search``'s count, cached)."""
        if self._vector_search is None or self._vector_search.embedder is not embedder:
            self._vector_search = VectorSearch(
                self.engine, embedder, exact_below=self.settings.recall_exact_below
            )
        filters = [
            EpisodeRow.project_id == self.project_id,
            EpisodeRow.user_id.is_(None) if user_id is None else EpisodeRow.user_id == user_id,
        ]
        if time_range is not None:
            lo, hi = as_utc(time_range[0]), as_utc(time_range[1])
            filters.append(EpisodeRow.occurred_at.between(lo, hi))
        scope = (self.project_id, user_id, time_range)
        size = await self._vector_search.scope_size(self.project_id, filters, scope)
        return size <= self._vector_search.exact_below

    async def _has_named_users(self) -> bool:
        statement = text(
            "SELECT 1 FROM episodes WHERE project_id = :p AND user_id IS NOT NULL LIMIT 1"
        )
        async with self.engine.connect() as conn:
            return (await conn.execute(statement, {"p": self.project_id})).first() is not None

    def _settings_embedder(self) -> Embedder:
        """The embedder of the settings (the indexer's), made once; its model loads on first
        use only. Its threads do not spin while they wait (``batches``): ``remember`` embeds
        with it too, between Postgres round trips on the same cores."""
        if self._default_embedder is None:
            self._default_embedder = embedder_from_settings(self.settings, batches=True)
        return self._default_embedder

    async def _query_embedder(self) -> Embedder | None:
        """The embedder for queries, once the project has vectors to compare with."""
        if self._vectors:
            return self._embedder
        embedder = self._embedder or self._settings_embedder()
        async with self.engine.connect() as conn:
            if not await has_vector_table(conn):
                return None
            found = await conn.execute(
                text(f"SELECT 1 FROM {VECTOR_TABLE} WHERE project_id = :p AND model = :m LIMIT 1"),
                {"p": self.project_id, "m": embedder.name},
            )
            if found.first() is None:
                return None
        self._embedder, self._vectors = embedder, True
        return embedder

    async def recall_facts(
        self,
        query: str,
        *,
        limit: int = 5,
        valid_at: datetime | None = None,
        user_id: str | None = None,
    ) -> list[Fact]:
        """The user's facts valid at ``valid_at`` best matching ``query``."""
        check_recall_facts(query, limit, valid_at)
        found = await self.facts.recall_text(query, limit=limit, valid_at=valid_at, user_id=user_id)
        return list(found)

    async def recall_facts_scored(
        self,
        query: str,
        *,
        limit: int = 5,
        valid_at: datetime | None = None,
        user_id: str | None = None,
    ) -> list[FactMatch]:
        """``recall_facts``'s facts, in its order, with their scores (``FactMatch``: fused,
        vector, words; ``FactStore.recall_scored``)."""
        check_recall_facts(query, limit, valid_at)
        found = await self.facts.recall_scored(
            query, limit=limit, valid_at=valid_at, user_id=user_id
        )
        return list(found)

    async def session_messages(
        self, session_id: str, *, user_id: str | None = None, limit: int = 20
    ) -> list[Message]:
        """The session's last ``limit // 2`` turns as messages, oldest first."""
        check_session(session_id, limit)
        async with self.engine.connect() as conn:
            recent = await turns.episodes_of(
                conn,
                self.project_id,
                user_id,
                session_id=session_id,
                newest_first=True,
                limit=max(1, limit // 2),
            )
        return turns.session_messages_of(list(reversed(recent)))

    # -- profile, export, forget ------------------------------------------------------------

    async def profile(self, *, user_id: str | None = None) -> MemoryProfile:
        """Counts, the ten most recent distinct sessions (newest first), last seen, and the
        ten most recently recorded facts."""
        async with self.engine.connect() as conn:
            count, last_seen, recent = await turns.activity_of(conn, self.project_id, user_id)
        return MemoryProfile(
            user_id=user_id,
            episode_count=int(count),
            fact_count=await self.facts.count(user_id=user_id),
            last_seen=last_seen,
            recent_sessions=recent,
            sample_facts=await self.facts.query(user_id=user_id, limit=10),
        )

    async def export(self, *, user_id: str | None = None) -> MemoryExport:
        """Everything kept about the user: episodes (oldest first), facts, blocks."""
        async with self.engine.connect() as conn:
            episodes = await turns.episodes_of(conn, self.project_id, user_id)
            user_blocks = await blocks.read_blocks(conn, self.project_id, user_id)
        facts = await self.facts.query(user_id=user_id, limit=1_000_000)
        return MemoryExport(
            user_id=user_id,
            episodes=episodes,
            facts=sorted(facts, key=lambda f: (f.recorded_at, f.id)),
            blocks=user_blocks,
        )

    async def forget(
        self,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        before: datetime | None = None,
        since: datetime | None = None,
    ) -> int:
        """Forget the user's episodes (of one session, or older than ``before``; with
        ``since`` too, of the range ``[since, before)`` only) everywhere
        memworker keeps them, vectors and stream entries included, through the code
        ``memworker forget --user`` runs (``worker.erasure.forget.forget_project``: an
        erasure record keeps every replay from bringing them back); without ``session_id``
        the user's facts and blocks too (with it, the facts made only from that session).
        ``user_id=None`` is the anonymous bucket. How many
        episodes, facts and blocks went (LoomFlow's count). Raises
        ``ForgetIncompleteError`` when something could not be removed.

        In a LoomFlow program, the fact extractions its ``AutoExtractMemory`` still runs on
        what this forgets are stopped first (LoomFlow's rule), so none writes a fact back."""
        check_user_id(user_id)
        since, before = check_range(since, before)  # refused before anything is touched
        if since is not None and session_id is None and not self._facts_are_ours():
            raise InvalidForgetError(
                "since: this memory's fact store forgets only what is older than a time, "
                "not a range; nothing was forgotten"
            )
        extractions = sys.modules.get("loomflow.memory._extractions")
        if extractions is not None:
            await extractions.stop_extractions(
                self, user_id=user_id, session_id=session_id, before=before
            )
        result = await forget_project(
            self.engine,
            self.project_id,
            session_id=session_id,
            before=before,
            since=since,
            redis=self.redis,  # type: ignore[arg-type]
            prefix=self.settings.stream_prefix,
            shards=self.settings.shards,
            user_id=user_id,
            anonymous_user=user_id is None,
        )
        removed = result.receipt.postgres if result.receipt is not None else {}
        counts = {
            "episodes": removed.get("episodes", 0),
            "facts": removed.get("facts", 0),
            "blocks": removed.get("memory_blocks", 0),
        }
        if session_id is None and not self._facts_are_ours():
            counts["facts"] = await self._delete_other_facts(user_id, before)
        async with self.engine.begin() as conn:
            event = change_event(
                "memory.forgotten",
                self.project_id,
                user_id,
                f"{user_id}/{session_id}",
                session_id=session_id,
                before=None if before is None else before.isoformat(),
                **({} if since is None else {"since": since.isoformat()}),
                counts=counts,
            )
            await owe(conn, self.project_id, [event])
        await self._flush_quietly()
        return sum(counts.values())

    def _facts_are_ours(self) -> bool:
        return isinstance(self.facts, FactStore) and self.facts.project_id == self.project_id

    async def _delete_other_facts(self, user_id: str | None, before: datetime | None) -> int:
        deleter = getattr(self.facts, "delete", None)  # LoomFlow's rule: a store without one
        return int(await deleter(user_id=user_id, before=before)) if callable(deleter) else 0

    # -- consolidation ----------------------------------------------------------------------

    async def consolidate(self) -> None:
        """Run the extractor over every episode of the project not yet consolidated, each once
        (``extractors``); nothing without one."""
        if self._consolidator is None:
            return
        token = _CONSOLIDATING.set(True)
        try:
            await run_extractor(self.engine, self.project_id, self._consolidator, self.facts)
        finally:
            _CONSOLIDATING.reset(token)
            await self._flush_quietly()

    async def _flush_quietly(self) -> None:
        if _CONSOLIDATING.get():
            return  # published when the extractor's transaction is over (``consolidate``)
        try:
            await self.flush_changes()
        except Exception as exc:
            log.warning("change feed: events stay owed", error=str(exc).splitlines()[:1])
