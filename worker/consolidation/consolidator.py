"""The consolidator: results from ``P:results:{i}`` into Postgres, then ``episode.recorded``.

Why it is shaped this way:

- **Commit, then acknowledge.** A batch is written in one transaction (``INSERT … ON CONFLICT
  DO NOTHING``), and its entries are acknowledged only after the COMMIT. A crash anywhere leaves
  them pending; the redelivery conflicts with the rows already there and writes nothing twice.
- **Acknowledged once committed; announced from an outbox.** ``episodes.announced_at`` is null
  until ``episode.recorded`` is published. A batch's entries are acknowledged once its rows are
  COMMITted, whether or not the announcement got out: a full Redis refuses XADD (``denyoom``) but
  not XACK, so results are acknowledged, retention trims them and memory frees. Announcing is
  tried right after the COMMIT; what is refused, or lost to a crash between COMMIT and XADD, is
  published later by the relay (``worker.episodes.announcements``, run by the group loop's
  ``tick``). A replay of an announced episode publishes nothing.
- **Postgres down is not a poison entry.** When a write fails, ``SELECT 1`` tells the two
  apart. Down: nothing is acknowledged and the loop backs off (capped) until it answers. Up: the
  batch is split in halves until the failing entry stands alone. A data error (SQLSTATE class 22
  or 54: a NUL byte, a value out of range) is that entry's own and the same every time: it alone
  is dead-lettered at once (``unstorable_data``, the error naming the problem). Any other error
  is retried with backoff and dead-lettered (``storage_failed``) after
  ``consolidation_max_attempts`` failures.
- **Forgotten stays forgotten.** Each write takes the shared advisory lock of its projects and
  skips the results an ``erasures`` row covers (``worker.db.erasures``), in the transaction
  that writes the rest; a ``forgotten`` rejection is acknowledged, never stored. Replays go
  through the same write, so none brings back what ``memworker forget`` removed.
- **It trims what it writes.** ``P:episodes`` gets the retention of the other streams
  (``worker.consumers.retention``: ``MINID`` below every group's oldest pending and
  undelivered entry, ``MEMWORKER_RETENTION_SECONDS`` kept), from the loop's ``tick`` every
  ``MEMWORKER_RETENTION_INTERVAL_SECONDS``; the lifecycle worker trims its two streams.
- **The group loop is ``worker.consumers.loop``**: own pending entries first, reclaim of dead
  consumers' entries, the delivery cap and DLQ, outages, readiness. This module is its handler:
  it turns entries into rows (``prepare``) and writes them (``finish``).
- **Both cores busy** (bench/consolidation_throughput.py). While a batch is written, the next
  is read and turned into rows; a batch is written as two transactions at once (split by
  session), since a Postgres backend uses one core and inserting is most of the work. Rows
  are tuples sent as one array per column (``worker.db.batch``), made by
  ``worker.consolidation.results``: a cheap structural test of a result's JSON types, the
  pydantic model deciding only what that test cannot vouch for (validation cost more than the
  INSERT).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.codec import UnusableEntryError
from worker.connections import consumer_client
from worker.consolidation.results import PreparedResult, prepare_result
from worker.consumers.loop import (
    BatchOutcome,
    Failure,
    GroupConsumer,
    Rejection,
    StorageUnavailableError,
    StreamEntry,
)
from worker.consumers.retention import ConsumedMarks, trim_dead_letters, trim_stream
from worker.consumers.service import GroupService
from worker.db.batch import insert_batch
from worker.db.engine import create_database_engine
from worker.db.erasures import (
    covered,
    erasure_cutoffs,
    erasure_ranges,
    lock_projects,
    written_at,
)
from worker.db.outages import first_line, is_connection_error, is_data_error, storage_error
from worker.episodes.announcements import Announcement, Announcer
from worker.episodes.changes import publish_all_owed, publish_owed
from worker.erasure.erased import record_erased
from worker.erasure.forget import finish_owed
from worker.keys import (
    CONSOLIDATION_GROUP,
    StreamKeys,
    all_changes_streams,
    changes_dlq,
    episodes_dlq,
    episodes_stream,
)
from worker.logs import get_logger
from worker.metrics import (
    CONSOLIDATION_SECONDS,
    EPISODES_RECORDED,
    RESULTS_STORED,
)
from worker.settings import Settings
from worker.user_memory.extractors import extract_session_lessons

__all__ = ["ConsolidationOutcome", "Consolidator", "PreparedBatch"]

LESSONS_INTERVAL_S = 2.0
"""How often the consolidator turns stored sessions' lessons into facts."""

log = get_logger("worker.consolidation.consolidator")

PREPARE_SLICE = 50
"""Entries prepared between two turns of the event loop (see ``Consolidator.prepare``)."""
MIN_PART = 50
"""A batch is written in parts (``Consolidator.writers``) only when each can have this many."""


@dataclass(slots=True)
class PreparedBatch:
    """A batch read and turned into rows, not yet written."""

    results: list[PreparedResult] = field(default_factory=list)
    dead: list[Rejection] = field(default_factory=list)


@dataclass(slots=True)
class ConsolidationOutcome(BatchOutcome):
    episodes_announced: int = 0


class Consolidator(GroupService):
    """Consumes ``P:results:{i}`` of every shard in group ``consolidation`` into Postgres: the
    ``GroupHandler`` of a ``GroupConsumer`` (``self.loop``), which runs the group."""

    group = CONSOLIDATION_GROUP
    storage_errors: tuple[type[BaseException], ...] = (StorageUnavailableError,)
    failure_reason = "storage_failed"

    def __init__(
        self,
        settings: Settings,
        redis: Redis | RedisCluster,
        engine: AsyncEngine,
        *,
        batch_size: int | None = None,
        probe_timeout_s: float = 5.0,
        writers: int = 2,
        relay_batch: int = 500,
        relay_grace_s: float = 10.0,
        relay_retry_s: float = 1.0,
        relay_sweep_interval_s: float = 60.0,
        **loop_options: Any,
    ) -> None:
        """``loop_options`` override the loop's shared settings (``GroupConsumer.from_settings``):
        ``consumer``, ``block_ms``, ``reclaim_idle_ms``, ``backoff_initial_s``, ... .

        The relay (``relay``) publishes up to ``relay_batch`` owed announcements per
        transaction, of episodes recorded at least ``relay_grace_s`` ago, every
        ``relay_retry_s`` while something is owed and every ``relay_sweep_interval_s``
        anyway (``Announcer``)."""
        self.settings = settings
        self.redis = redis
        self.engine = engine
        self.probe_timeout_s = probe_timeout_s
        self.writers = writers
        shards = [StreamKeys(settings.stream_prefix, i) for i in range(settings.shards)]
        self.streams = [keys.results for keys in shards]
        self._dlq_of = {keys.results: keys.dlq for keys in shards}
        self.consumed_marks = ConsumedMarks()
        """Retention of streams with ids ahead of the clock (``worker.consumers.retention``)."""
        self.announcer = Announcer(
            redis,
            engine,
            episodes_stream(settings.stream_prefix),
            log,
            batch=relay_batch,
            grace_s=relay_grace_s,
            retry_s=relay_retry_s,
            sweep_interval_s=relay_sweep_interval_s,
        )
        self.loop: GroupConsumer[PreparedBatch] = GroupConsumer.from_settings(
            redis,
            self,
            settings,
            batch_size=batch_size or settings.consolidation_batch_size,
            max_attempts=settings.consolidation_max_attempts,
            tick=self.tick,
            **loop_options,
        )
        self.consumer = self.loop.consumer
        self.log = self.announcer.log = log.bind(consumer=self.consumer)
        self._last_trim = float("-inf")
        self._last_lessons = float("-inf")

    # -- public --------------------------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> Consolidator:
        """A consolidator with its own Redis client and engine (closed by ``close``)."""
        redis, engine = consumer_client(settings), create_database_engine(settings.database_url)
        return cls(settings, redis, engine, **options).owning(redis.aclose, engine.dispose)

    async def relay(self, max_batches: int = 10) -> int:
        """Publish episodes still owed an ``episode.recorded``; how many (``Announcer.relay``)."""
        return await self.announcer.relay(max_batches)

    async def trim_once(self, keep_seconds: float | None = None) -> int:
        """Trim ``P:episodes`` (which this consolidator writes) and the change feed
        (``P:changes:{i}``) below what every group reading them has acknowledged, keeping
        ``keep_seconds`` of them (default: the retention setting, as for the lifecycle and
        results streams), and the indexer's and the change feed's DLQs to ``dlq_max_entries``
        and ``dlq_retention_seconds``; how many entries were removed."""
        settings = self.settings
        keep = settings.retention_seconds if keep_seconds is None else keep_seconds
        marks = self.consumed_marks
        removed = await trim_stream(self.redis, self.announcer.stream, keep, marks)
        for stream in all_changes_streams(settings.stream_prefix, settings.shards):
            removed += await trim_stream(self.redis, stream, keep, marks)
        for dlq in (episodes_dlq(settings.stream_prefix), changes_dlq(settings.stream_prefix)):
            removed += await trim_dead_letters(
                self.redis, dlq, settings.dlq_max_entries, settings.dlq_retention_seconds
            )
        return removed

    async def lessons_once(self, batch: int = 500) -> int:
        """Turn stored sessions' lessons into facts about their agent type (each session once,
        ``worker.user_memory.extractors.extract_session_lessons``) and publish the facts'
        change events; how many sessions were done."""
        done, projects = await extract_session_lessons(self.engine, batch)
        for project_id in sorted(projects):
            await publish_owed(
                self.engine,
                self.redis,
                self.settings.stream_prefix,
                self.settings.shards,
                project_id,
            )
        return done

    async def sync_erased(self) -> int:
        """Copy the erasure record (the ``erasures`` table) to ``P:erased``, which the replay of
        commands and the DLQ's redrive read: a Redis restored from a backup taken before a
        forget gets it back within one retention interval. How many scopes were written."""
        async with self.engine.connect() as conn:
            cutoffs = await erasure_cutoffs(conn)
            ranges = await erasure_ranges(conn)
        for (project, session, user), since, end in ranges:  # P:erased_ranges
            await record_erased(
                self.redis,  # type: ignore[arg-type]
                self.settings.stream_prefix,
                project,
                session,
                int(end.timestamp() * 1000),
                user_id=user,
                since_ms=int(since.timestamp() * 1000),
            )
        for (project, session, user), cutoff in cutoffs.items():
            await record_erased(
                self.redis,  # type: ignore[arg-type]
                self.settings.stream_prefix,
                project,
                session,
                int(cutoff.timestamp() * 1000),
                user_id=user,
                shards=self.settings.shards,
            )
        return len(cutoffs) + len(ranges)

    async def finish_owed_forgets(self) -> int:
        """Finish the forgets still owed (``worker.erasure.owed``: recorded at least
        ``OWED_GRACE_S`` ago), each to exactly its recorded scope and cutoff; how many were
        finished (one that fails again stays owed, and is logged)."""
        settings = self.settings
        receipts = await finish_owed(
            self.engine,
            self.redis,  # type: ignore[arg-type]
            settings.stream_prefix,
            marker_ttl_ms=1000 * max(settings.tombstone_ttl_seconds, settings.dedupe_ttl_seconds),
            shards=settings.shards,
        )
        for receipt in receipts:
            if not receipt.ok:
                self.log.warning(
                    "owed forget still incomplete, will retry",
                    erasure_id=receipt.erasure_id,
                    error="; ".join(receipt.errors),
                )
        return sum(1 for r in receipts if r.ok)

    async def tick(self) -> None:
        """The group loop's ``tick``: the announcement relay when due, then retention of
        ``P:episodes``, the copy of the erasure record (``sync_erased``), the change events and
        the forgets still owed (``publish_all_owed``, ``finish_owed_forgets``) every
        ``MEMWORKER_RETENTION_INTERVAL_SECONDS``, and every ``LESSONS_INTERVAL_S`` the lessons
        of stored sessions as facts (``lessons_once``). Never raises but for
        cancellation: a trim that fails is logged and tried at the next interval."""
        await self.announcer.tick()
        now = asyncio.get_running_loop().time()
        if self.settings.lesson_facts and now - self._last_lessons >= LESSONS_INTERVAL_S:
            self._last_lessons = now
            try:
                await self.lessons_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Postgres or Redis unavailable: the next tick retries
                self.log.warning("lessons not turned into facts, will retry", error=first_line(exc))
        if now - self._last_trim < self.settings.retention_interval_seconds:
            return
        self._last_trim = now
        try:
            await self.trim_once()
            await self.sync_erased()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis unavailable: the loop meets it too; trim next time
            self.log.warning("episodes stream not trimmed, will retry", error=first_line(exc))
        try:
            await publish_all_owed(
                self.engine, self.redis, self.settings.stream_prefix, self.settings.shards
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a server unavailable: they stay owed to the next interval
            self.log.warning("owed change events not published, will retry", error=first_line(exc))
        try:
            await self.finish_owed_forgets()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a server unavailable: the next interval tries again
            self.log.warning("owed forgets not finished, will retry", error=first_line(exc))

    async def replay(self, entries: Sequence[StreamEntry]) -> ConsolidationOutcome:
        """Store ``entries`` again (a replay): idempotent; junk is skipped, not dead-lettered,
        and nothing is acknowledged."""
        outcome = ConsolidationOutcome()
        batch = await self.prepare(entries)
        outcome.dead_lettered += len(batch.dead)
        if batch.results:
            await self._store_all(batch.results, outcome)
        outcome.dead_lettered += len(outcome.failed) + len(outcome.rejected)
        return outcome

    # -- the group handler ---------------------------------------------------------------------

    def dlq_stream(self, stream: str) -> str:
        return self._dlq_of[stream]

    async def check_storage(self) -> None:
        if (error := await self._storage_error()) is not None:
            message = f"postgres cannot be used: {first_line(error)}"
            raise StorageUnavailableError(message) from error

    async def prepare(self, entries: Sequence[StreamEntry]) -> PreparedBatch:
        """Turn entries into rows. Every ``PREPARE_SLICE`` entries it lets the loop run, so a
        write in flight takes its next step (COMMIT, XADD, …) without waiting for the batch."""
        batch = PreparedBatch()
        max_chars = self.settings.context_summary_max_chars
        for i, entry in enumerate(entries):
            if i and not i % PREPARE_SLICE:
                await asyncio.sleep(0)
            try:
                batch.results.append(prepare_result(entry, max_chars))
            except UnusableEntryError as exc:
                batch.dead.append(Rejection(entry, exc.reason, str(exc)))
            except Exception as exc:  # a valid result its rows cannot be made of: never will be
                error = f"no rows could be made of it: {exc!r}"
                batch.dead.append(Rejection(entry, "invalid_result", error))
        return batch

    async def finish(self, batch: PreparedBatch) -> ConsolidationOutcome:
        started = time.perf_counter()
        outcome = ConsolidationOutcome(rejected=list(batch.dead))
        if batch.results:
            await self._store_all(batch.results, outcome)
        CONSOLIDATION_SECONDS.observe(time.perf_counter() - started)
        RESULTS_STORED.inc(len(outcome.done))
        EPISODES_RECORDED.inc(outcome.episodes_announced)
        return outcome

    async def _store_all(
        self, results: Sequence[PreparedResult], outcome: ConsolidationOutcome
    ) -> None:
        """Store ``results`` as up to ``writers`` transactions at once, on as many connections:
        a Postgres backend uses one core, and inserting is most of the work (two writers
        drained the benchmark's stream ~40% faster than one on two cores). A session's results
        all go to the same part, so two parts never insert the same row, nor wait on each
        other's locks."""
        if self.writers < 2 or len(results) < 2 * MIN_PART:
            await self._store(results, outcome)
            return
        parts: list[list[PreparedResult]] = [[] for _ in range(self.writers)]
        for p in results:
            session = p.event[3]
            parts[
                hash((p.event[2], session) if session is not None else p.event_id) % len(parts)
            ].append(p)
        try:
            async with asyncio.TaskGroup() as group:
                for part in parts:
                    if part:
                        group.create_task(self._store(part, outcome))
        except BaseExceptionGroup as failed:  # the first failure, as one writer would raise it
            errors: list[BaseException] = list(failed.exceptions)
            errors.sort(key=lambda e: not isinstance(e, StorageUnavailableError))
            raise errors[0] from None

    # -- storing -------------------------------------------------------------------------------

    async def _store(self, parsed: Sequence[PreparedResult], outcome: ConsolidationOutcome) -> None:
        """Write ``parsed`` in one transaction; on a data error split it to isolate the culprit."""
        try:
            announcements = await self._write(parsed)
        except Exception as exc:
            if is_connection_error(exc) or await self._storage_error() is not None:
                raise StorageUnavailableError(
                    f"postgres cannot be used: {first_line(exc)}"
                ) from exc
            if len(parsed) > 1:
                middle = len(parsed) // 2
                await self._store(parsed[:middle], outcome)
                await self._store(parsed[middle:], outcome)
                return
            if is_data_error(exc):  # the row's own problem: the same every time, never retried
                error = f"Postgres refused its data: {first_line(exc)}"
                outcome.rejected.append(Rejection(parsed[0].entry, "unstorable_data", error))
                return
            outcome.failed.append(self._failure(parsed[0], exc))
            return
        outcome.done.extend(p.entry for p in parsed)  # committed: acknowledged, announced or not
        # Awaited first, then added: ``x += await`` reads ``x`` before the await, and the other
        # writer's addition made meanwhile would be lost.
        announced = await self.announcer.announce(announcements)
        outcome.episodes_announced += announced

    @staticmethod
    def _failure(parsed: PreparedResult, exc: Exception) -> Failure:
        error = first_line(exc)
        context = {
            "event_id": parsed.event_id,
            "project_id": parsed.event[2],
            "session_id": parsed.event[3],
        }
        return Failure(parsed.entry, error, context)

    async def _write(self, prepared: Sequence[PreparedResult]) -> list[Announcement]:
        """One transaction; returns the episodes owed an ``episode.recorded``: new ones, and
        ones a crash left unannounced (replayed, or redelivered after a crash before XADD)."""
        events: dict[str, tuple[Any, ...]] = {}
        episodes: dict[str, tuple[Any, ...]] = {}
        prepared = [p for p in prepared if not _forgotten_rejection(p)]
        async with self.engine.begin() as conn:
            # Shared locks of the projects, then the erasure record (``worker.db.erasures``):
            # a forget runs wholly before this transaction or wholly after it.
            await lock_projects(conn, (p.event[2] for p in prepared if p.event[2] is not None))
            erased = await covered(
                conn,
                [
                    (
                        p.event[2],
                        p.event[3],
                        p.event[8],
                        _user_of(p),
                        written_at(p.entry.entry_id, p.event[8]),
                    )
                    for p in prepared
                ],
            )
            for p, gone in zip(prepared, erased, strict=True):
                if gone:
                    continue  # forgotten (memworker forget): never stored again
                events.setdefault(p.event_id, p.event)
                if p.episode is not None:
                    episodes.setdefault(p.event_id, p.episode)
            owed = await insert_batch(conn, list(events.values()), list(episodes.values()))
        return [Announcement(*key) for key in owed]

    async def _storage_error(self) -> Exception | None:
        """None when Postgres answers ``SELECT 1`` within ``probe_timeout_s``, else why not."""
        return await storage_error(self.engine, self.probe_timeout_s)


def _user_of(prepared: PreparedResult) -> str | None:
    """The user a result carries (the session's spawn named one), for the erasure check."""
    if prepared.episode is not None:
        return prepared.episode[16]  # type: ignore[no-any-return]
    if '"user_id"' not in prepared.event[9]:
        return None  # the usual case: no JSON to parse again
    user = orjson.loads(prepared.event[9]).get("user_id")
    return user if isinstance(user, str) else None


def _forgotten_rejection(prepared: PreparedResult) -> bool:
    """A ``forgotten`` rejection: ids only, and not stored (a row would bring the forgotten
    session back into ``lifecycle_events``)."""
    return prepared.event[1] == "command.rejected" and '"reason":"forgotten"' in prepared.event[9]
