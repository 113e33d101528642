"""The indexer (``memworker index``): embeds every announced episode, and every fact the change
feed announces (``fact.added`` on ``P:changes:{j}``), off the hot path.

It follows ``P:episodes`` in consumer group ``indexer`` on the shared loop
(``worker.consumers.loop.GroupConsumer``: own pending first, reclaim, delivery cap, DLQ
``P:dlq:episodes``, outages never poison). Per batch it reads the episodes' text from Postgres,
embeds those that have no vector of the configured model yet, and upserts the vectors.

Batches overlap: the loop reads the next batch while this one is finished, and ``prepare``
starts reading and embedding it at once (in a thread: ONNX Runtime releases the GIL), one
embedding at a time, so the next batch's embedding runs while this one's vectors are written
and its ``episode.recallable`` published. A batch read ahead and then dropped by the loop (this
one failed) has its embedding cancelled; nothing of it was written.

Idempotent by construction: the vector row is keyed by the episode id, an episode that already
has a vector of this model is not embedded again, and an equal vector is never rewritten. So a
redelivery, a replay of ``P:episodes`` or a restart after a kill costs at most a re-embedding
of the batch in hand, and never a duplicate or a lost vector.

An embedding server that does not answer (provider ``openai``) is a server-wide condition like
a Postgres outage: nothing is acknowledged, no attempt is counted, the loop backs off.
Without pgvector (no ``episode_embeddings`` table) entries are acknowledged with one warning:
``memworker reindex`` backfills once pgvector is there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.connections import consumer_client
from worker.consumers.loop import (
    BatchOutcome,
    Failure,
    GroupConsumer,
    Rejection,
    StorageUnavailableError,
    StreamEntry,
)
from worker.consumers.service import GroupService
from worker.db.engine import create_database_engine
from worker.db.outages import first_line, is_connection_error
from worker.db.vectors import (
    ensure_dimension_index,
    has_vector_table,
    missing_pgvector,
)
from worker.episodes.backlog import IndexingBacklog, probe_indexing_backlog
from worker.episodes.changes import publish_owed_many
from worker.episodes.embedding import Embedder, EmbeddingError, embedder_from_settings
from worker.episodes.vectorising import (
    Embedded,
    embed_facts,
    embed_rows,
    store_embedded,
    unindexed,
)
from worker.keys import all_changes_streams, episodes_dlq, episodes_stream
from worker.logs import get_logger
from worker.metrics import EPISODES_INDEXED, INDEX_SECONDS
from worker.settings import Settings

log = get_logger("worker.episodes.indexer")

INDEXER_GROUP = "indexer"


def indexer_dlq(prefix: str) -> str:
    return episodes_dlq(prefix)


@dataclass(frozen=True, slots=True)
class Announced:
    entry: StreamEntry
    episode_id: str


@dataclass(frozen=True, slots=True)
class AddedFact:
    """A ``fact.added`` of the change feed: the fact to embed."""

    entry: StreamEntry
    project_id: str
    fact_id: str


@dataclass(slots=True, weakref_slot=True)
class IndexBatch:
    episodes: list[Announced] = field(default_factory=list)
    facts: list[AddedFact] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    other: list[StreamEntry] = field(default_factory=list)
    """Other events (``memory.forgotten``, the feed's other changes): acknowledged, nothing
    to embed."""
    embedding: asyncio.Future[Embedded] | None = None
    """Its episodes' rows and vectors, started by ``prepare`` (cancelled if it is dropped)."""


def parse_change(entry: StreamEntry) -> AddedFact | None:
    """The fact a ``fact.added`` entry of the change feed names; None for another change;
    ValueError when the entry is no change event."""
    raw = entry.fields.get("data", entry.fields.get(b"data"))
    if raw is None:
        raise ValueError("no 'data' field")
    event = orjson.loads(raw)
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ValueError("not a change event")
    if event["type"] != "fact.added":
        return None
    return AddedFact(entry, str(event["project_id"]), str(event["fact_id"]))


def parse_announcement(entry: StreamEntry) -> Announced:
    """The episode an ``episode.recorded`` entry names; ValueError when it names none."""
    raw = entry.fields.get("data", entry.fields.get(b"data"))
    if raw is None:
        raise ValueError("no 'data' field")
    event = orjson.loads(raw)
    if not isinstance(event, dict) or event.get("type") != "episode.recorded":
        raise ValueError("not an episode.recorded event")
    return Announced(entry, str(uuid.UUID(str(event["episode_id"]))))


def _is_forgotten_event(entry: StreamEntry) -> bool:
    raw = entry.fields.get("data", entry.fields.get(b"data"))
    if raw is None or b"memory.forgotten" not in (raw if isinstance(raw, bytes) else raw.encode()):
        return False
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and event.get("type") == "memory.forgotten"


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A dropped batch's embedding may fail unawaited: its error is not worth a log line."""
    if not future.cancelled():
        future.exception()


class Indexer(GroupService):
    """The ``GroupHandler`` of group ``indexer`` on ``P:episodes`` (``self.loop`` runs it)."""

    group = INDEXER_GROUP
    storage_errors: tuple[type[BaseException], ...] = (StorageUnavailableError,)
    failure_reason = "index_failed"

    def __init__(
        self,
        settings: Settings,
        redis: Redis | RedisCluster,
        engine: AsyncEngine,
        embedder: Embedder | None = None,
        **loop_options: Any,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.engine = engine
        self.embedder = embedder or embedder_from_settings(settings, batches=True)
        self._changes = tuple(all_changes_streams(settings.stream_prefix, settings.shards))
        self.streams = (episodes_stream(settings.stream_prefix), *self._changes)
        self._episode_entries = 0
        self._dlq = indexer_dlq(settings.stream_prefix)
        self._vectors: bool | None = None
        self._embedding_turn = asyncio.Lock()
        """One batch's embedding at a time: the next waits while this one's is written."""
        self._embeddings: weakref.WeakSet[asyncio.Future[Embedded]] = weakref.WeakSet()
        self.backlog: IndexingBacklog | None = None
        """The last probe's (``worker.episodes.backlog``); None before the first."""
        self._backlog_probed = 0.0
        self.loop: GroupConsumer[IndexBatch] = GroupConsumer.from_settings(
            redis,
            self,
            settings,
            batch_size=settings.index_batch_size,
            max_attempts=settings.index_max_attempts,
            **{"tick": self.probe_backlog_when_due, **loop_options},
        )

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> Indexer:
        """An indexer with its own Redis client and engine (closed by ``close``)."""
        redis, engine = consumer_client(settings), create_database_engine(settings.database_url)
        return cls(settings, redis, engine, **options).owning(redis.aclose, engine.dispose)

    def is_ready(self) -> bool:
        """The loop is ready (``GroupConsumer.is_ready``) and the oldest announced episode not
        indexed yet is at most ``MEMWORKER_INDEX_MAX_LAG_SECONDS`` old."""
        age = self.backlog.oldest_age_s() if self.backlog is not None else None
        return self.loop.is_ready() and (age is None or age <= self.settings.index_max_lag_seconds)

    async def probe_backlog_when_due(self) -> None:
        """The loop's ``tick``: every ``MEMWORKER_LAG_PROBE_SECONDS``, the backlog and its
        gauges (a few Redis calls, no Postgres); a failure is logged and tried next time."""
        now = time.monotonic()
        if (
            self.backlog is not None
            and now - self._backlog_probed < self.settings.lag_probe_seconds
        ):
            return
        self._backlog_probed = now
        try:
            self.backlog = await probe_indexing_backlog(self.redis, self.settings.stream_prefix)
        except Exception as exc:
            log.warning("indexing backlog not probed", error=first_line(exc))

    # -- the group handler ---------------------------------------------------------------------

    def dlq_stream(self, stream: str) -> str:
        return self._dlq

    async def check_storage(self) -> None:
        try:
            async with asyncio.timeout(5), self.engine.begin() as conn:
                await conn.execute(text("SELECT 1"))
                if self._vectors is None:
                    self._vectors = await has_vector_table(conn)
                    if self._vectors:
                        why = await ensure_dimension_index(conn, self.embedder.dimension)
                        if why is not None:
                            log.warning(why)
                    else:
                        log.warning(missing_pgvector(conn.dialect.server_version_info))
        except Exception as exc:
            raise StorageUnavailableError(f"postgres cannot be used: {first_line(exc)}") from exc

    async def prepare(self, entries: Sequence[StreamEntry]) -> IndexBatch:
        batch = IndexBatch()
        for entry in entries:
            if entry.stream in self._changes:
                try:
                    added = parse_change(entry)
                except Exception as exc:
                    batch.rejected.append(Rejection(entry, "unparseable", repr(exc)))
                    continue
                if added is None:
                    batch.other.append(entry)
                else:
                    batch.facts.append(added)
                continue
            if _is_forgotten_event(entry):
                batch.other.append(entry)
                continue
            try:
                batch.episodes.append(parse_announcement(entry))
            except Exception as exc:
                batch.rejected.append(Rejection(entry, "unparseable", repr(exc)))
        if batch.episodes and self._vectors:
            batch.embedding = self._start_embedding(batch)
        return batch

    def _start_embedding(self, batch: IndexBatch) -> asyncio.Future[Embedded]:
        """Read and embed ``batch``'s episodes now, in the background (see the module
        docstring); the task is cancelled if the batch is dropped unfinished."""
        ids = list(dict.fromkeys(a.episode_id for a in batch.episodes))
        future = asyncio.ensure_future(self._embed_episodes(ids))
        future.add_done_callback(_retrieved)
        self._embeddings.add(future)
        weakref.finalize(batch, future.cancel).atexit = False
        return future

    async def _embed_episodes(self, ids: Sequence[str]) -> Embedded:
        rows = await unindexed(self.engine, self.embedder.name, ids)
        if not rows:
            return Embedded([], [])
        async with self._embedding_turn:
            return await embed_rows(self.embedder, rows)

    def _cancel_embeddings(self) -> None:
        for future in list(self._embeddings):
            future.cancel()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await super().run(stop)
        finally:  # a batch read ahead when stopped is read again as pending by the next run
            self._cancel_embeddings()

    async def close(self) -> None:
        self._cancel_embeddings()
        await super().close()

    async def run_once(self) -> int:
        """Handle everything available now; how many entries of ``P:episodes`` were finished
        (the change feed's, which the indexer reads too, are not counted)."""
        before = self._episode_entries
        await self.loop.run_once()
        return self._episode_entries - before

    async def finish(self, batch: IndexBatch) -> BatchOutcome:
        outcome = await self._finish(batch)
        self._episode_entries += sum(
            1
            for entry in (*outcome.done, *(r.entry for r in outcome.rejected))
            if entry.stream not in self._changes
        )
        return outcome

    async def _finish(self, batch: IndexBatch) -> BatchOutcome:
        started = time.perf_counter()
        outcome = BatchOutcome(rejected=list(batch.rejected))
        outcome.done.extend(batch.other)
        if batch.facts:  # no pgvector needed: a fact's vector is a float8[] beside it
            try:
                await embed_facts(
                    self.engine, self.embedder, [(f.project_id, f.fact_id) for f in batch.facts]
                )
            except EmbeddingError as exc:
                raise StorageUnavailableError(f"embedder cannot be used: {exc}") from exc
            except Exception as exc:
                if is_connection_error(exc):
                    raise StorageUnavailableError(first_line(exc)) from exc
                outcome.failed.extend(
                    Failure(f.entry, first_line(exc), {"fact_id": f.fact_id}) for f in batch.facts
                )
            else:
                outcome.done.extend(f.entry for f in batch.facts)
        if not batch.episodes:
            return outcome
        if self._vectors is None:
            await self.check_storage()
        if not self._vectors:  # no pgvector: nothing to store; reindex backfills later
            outcome.done.extend(a.entry for a in batch.episodes)
            return outcome
        pending = batch.embedding or self._start_embedding(batch)
        projects: set[str] = set()
        try:
            embedded = await store_embedded(self.engine, self.embedder, await pending, projects)
        except EmbeddingError as exc:
            raise StorageUnavailableError(f"embedder cannot be used: {exc}") from exc
        except Exception as exc:
            if is_connection_error(exc):
                raise StorageUnavailableError(first_line(exc)) from exc
            # a data error: say which entries, the loop retries them and dead-letters at the cap
            outcome.failed.extend(
                Failure(a.entry, first_line(exc), {"episode_id": a.episode_id})
                for a in batch.episodes
            )
            return outcome
        outcome.done.extend(a.entry for a in batch.episodes)
        await self._publish_recallable(projects)
        EPISODES_INDEXED.inc(embedded)
        INDEX_SECONDS.observe(time.perf_counter() - started)
        return outcome

    async def _publish_recallable(self, projects: set[str]) -> None:
        """Publish the batch's ``episode.recallable`` events; what Redis refuses stays owed to
        the project's next change (``episodes.changes``): the vectors are stored either way.
        One transaction for all the batch's projects (``publish_owed_many``)."""
        if not projects:
            return
        try:
            await publish_owed_many(
                self.engine,
                self.redis,
                self.settings.stream_prefix,
                self.settings.shards,
                projects,
            )
        except Exception as exc:  # owed events wait; indexing goes on
            log.warning(
                "episode.recallable stays owed", projects=sorted(projects), error=first_line(exc)
            )
