"""One consumer-group loop for every Redis Streams group memworker runs.

The lifecycle worker (group ``lifecycle`` on every ``P:lifecycle:{i}``), the consolidator
(``consolidation`` on every ``P:results:{i}``), the indexer (on ``P:episodes``) and lifecycle
hooks (a user's group on every ``P:results:{i}``) differ only in what they do with a batch of
entries. Everything else is here, once:

- **Groups**: created at id ``0`` (``MKSTREAM``) on every stream, and again when Redis answers
  ``NOGROUP`` (a stream deleted, a restarted Redis without persistence).
- **Own pending first**: after a (re)start, a reclaim, a read that failed (its entries may
  have been delivered to a reply that never arrived: a frozen process, a dropped connection),
  or a batch that did not finish cleanly, this consumer's own unacknowledged entries (read
  from id ``0`` on, page by page) come before new ones (``>``). A failed read is logged.
- **Read-ahead**: while a batch is being finished (a Postgres COMMIT, a callback), the next
  one is read and prepared, so the store and Python work at once. It is used only if the batch
  in hand finished cleanly; otherwise its entries are read again as pending.
- **Reclaim**: every ``reclaim_interval_s``, entries idle ``reclaim_idle_ms`` in another
  consumer (one that died) are taken over with ``XAUTOCLAIM`` (the whole pending list is
  walked, ``batch_size`` a page) and then read as own pending.
- **Delivery cap**: an entry the handler reports *failed* is retried with backoff; after
  ``max_attempts`` failures, and ``retry_window_s`` after its first, it is dead-lettered
  (``worker.consumers.dead_letters``: XADD to the DLQ and XACK in one MULTI) with the
  handler's reason, the last error and its provenance. An entry the handler reports
  *rejected* (it can never be handled: unparseable, invalid) is
  dead-lettered at once.
  The count is the loop's own (failures of the handler), never Redis's delivery counter, which
  reading pending entries and XAUTOCLAIM bump too.
- **Outages are not poison**: when Redis is unavailable or refuses for a server-wide reason
  (``worker.redis_conditions``: full, busy, loading, failing over, unreachable), or the
  handler's storage is unavailable (the exceptions it names in ``storage_errors``), nothing is
  acknowledged or dead-lettered and no failure is counted: the consumer reports not ready,
  backs off (exponential, capped) and resumes. A ``Failure`` whose ``exc`` is such a condition
  counts as an outage too.
- **Readiness**: ``is_ready()`` is true once the groups exist and the last step reached Redis
  and the handler's storage (``check_storage`` is called at start and every
  ``storage_check_interval_s`` while idle, so a wrong password shows while nothing flows).
- **Side by side** (``side_by_side``, on a Redis Cluster): one loop per stream
  (``worker.consumers.side_by_side``), so a node that stops answering holds only its streams.
- **Stop**: ``run(stop)`` finishes the batch in hand and returns; its sleeps wake at once when
  ``stop`` is set (a blocking read returns within ``block_ms``).
- **Side work**: ``tick`` (optional) is awaited once per turn of ``run``, between batches (never
  while one is being finished); it must be cheap when it has nothing to do and must not raise
  for a server-wide condition: the consolidator's announcement relay is one.
- **Metrics**, the same for every group: entries handed to the handler
  (``memworker_deliveries_total{group}``), dead letters
  (``memworker_dead_letters_total{group,reason}``), entries per batch
  (``memworker_batch_size{group}``) and, every ``lag_probe_s``, the group's lag and pending
  count on each stream (``memworker_stream_lag`` / ``memworker_stream_pending``). The handler
  counts its own work in ``finish``.

The handler (``GroupHandler``, ``worker.consumers.entries``, where a minimal one is shown)
supplies the group and its streams, the DLQ of a stream, how to prepare a batch and how to
finish it; the loop then acknowledges, dead-letters and counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from worker.codec import text
from worker.consumers.backoff import backoff_delay, sleep_unless_stopped
from worker.consumers.dead_letters import dead_letter_entries
from worker.consumers.entries import (
    B,
    BatchOutcome,
    Failure,
    GroupHandler,
    Rejection,
    StorageUnavailableError,
    StreamEntry,
)
from worker.consumers.groups import default_consumer_name, ensure_group
from worker.consumers.lag import probe_group_lag
from worker.consumers.reading import read_group, stream_entries
from worker.consumers.side_by_side import one_loop_per_stream, run_side_by_side
from worker.logs import get_logger
from worker.metrics import BATCH_SIZE, DELIVERIES, REDIS_CONDITIONS
from worker.redis_conditions import is_server_condition, server_condition
from worker.settings import Settings

__all__ = [
    "BatchOutcome",
    "Failure",
    "GroupConsumer",
    "GroupHandler",
    "Rejection",
    "StorageUnavailableError",
    "StreamEntry",
    "default_consumer_name",
    "ensure_group",
]

log = get_logger("worker.consumers.loop")

Reclaimed = Callable[[str, Sequence[StreamEntry]], Awaitable[Collection[str]]]
"""A handler's optional ``reclaimed`` hook (see ``worker.consumers.entries``)."""


@dataclass(slots=True)
class _Batch(Generic[B]):
    work: B | None
    size: int
    gone: list[StreamEntry]


class GroupConsumer(Generic[B]):
    """Runs ``handler``'s group as consumer ``consumer`` (see the module docstring)."""

    def __init__(
        self,
        redis: Redis | RedisCluster,
        handler: GroupHandler[B],
        *,
        consumer: str | None = None,
        batch_size: int = 500,
        block_ms: int = 1_000,
        max_attempts: int = 10,
        reclaim_idle_ms: int = 60_000,
        reclaim_interval_s: float = 5.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 10.0,
        storage_check_interval_s: float = 5.0,
        lag_probe_s: float | None = None,
        tick: Callable[[], Awaitable[None]] | None = None,
        retry_window_s: float = 0.0,
        side_by_side: bool = False,
    ) -> None:
        self.redis, self.retry_window_s, self.tick = redis, retry_window_s, tick
        self.handler, self.group, self.streams = handler, handler.group, list(handler.streams)
        self.consumer = consumer or default_consumer_name()
        self.batch_size, self.block_ms, self.max_attempts = batch_size, block_ms, max_attempts
        self.reclaim_idle_ms, self.reclaim_interval_s = reclaim_idle_ms, reclaim_interval_s
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.storage_check_interval_s = storage_check_interval_s
        self.lag_probe_s = lag_probe_s
        self.acknowledges: bool = getattr(handler, "acknowledges", False)
        self.raw_fields: bool = getattr(handler, "raw_fields", False)
        self._reclaimed: Reclaimed | None = getattr(handler, "reclaimed", None)
        self._attempts: dict[tuple[str, str], tuple[int, float]] = {}  # failures, first's time
        self._claimed: list[StreamEntry] = []
        """Entries reclaimed and not handled yet (one page per stream at most)."""
        self._reclaim_cursor = dict.fromkeys(self.streams, "0-0")
        self._own_pending_from: dict[str, str] = {}
        """Streams whose own pending entries are (re)read, from which id on; empty: none."""
        self._read_ahead: _Batch[B] | None = None
        self._groups_ready = False
        self._storage_checked_at: float | None = None
        self._last_reclaim = 0.0
        self._last_lag_probe: float | None = None
        self._outages = 0
        self._split_reads = isinstance(redis, RedisCluster) and len(self.streams) > 1
        self._side_by_side = side_by_side and self._split_reads  # a loop per stream, if run
        self._parts: list[GroupConsumer[B]] = []  # then those loops
        self._deliveries = DELIVERIES.labels(self.group)
        self._batch_sizes = BATCH_SIZE.labels(self.group)
        self.log = log.bind(group=self.group, consumer=self.consumer)
        self.read_own_pending()

    @classmethod
    def from_settings(
        cls,
        redis: Redis | RedisCluster,
        handler: GroupHandler[B],
        settings: Settings,
        **options: Any,
    ) -> GroupConsumer[B]:
        """A loop with the settings every group shares (``MEMWORKER_BATCH_SIZE``,
        ``MEMWORKER_BLOCK_MS``, ``MEMWORKER_MAX_DELIVERIES``, ``MEMWORKER_RECLAIM_IDLE_MS``,
        ``MEMWORKER_RECLAIM_INTERVAL_MS``, ``MEMWORKER_LAG_PROBE_SECONDS``); ``options`` are a
        group's own overrides (the consolidator's and the indexer's batch size and attempts)."""
        shared: dict[str, Any] = {
            "batch_size": settings.batch_size,
            "block_ms": settings.block_ms,
            "max_attempts": settings.max_deliveries,
            "reclaim_idle_ms": settings.reclaim_idle_ms,
            "reclaim_interval_s": settings.reclaim_interval_ms / 1000,
            "lag_probe_s": settings.lag_probe_seconds,
        }
        return cls(redis, handler, **{**shared, **options})

    # -- state -----------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Its groups exist and the last step reached Redis and the storage."""
        if self._parts:
            return all(part.is_ready() for part in self._parts)
        return self._groups_ready and self._storage_checked_at is not None and self._outages == 0

    @property
    def in_outage(self) -> bool:
        """The last step failed for an outage (Redis or the storage); cleared by a good one."""
        return self._outages > 0 or any(part.in_outage for part in self._parts)

    def read_own_pending(self) -> None:
        """Read this consumer's unacknowledged entries again, from the first, before new ones."""
        self._read_ahead = None
        self._claimed = []  # pending to this consumer now: read with the rest
        self._own_pending_from = dict.fromkeys(self.streams, "0")

    # -- the loop --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; the batch in hand is finished first.

        Nothing but cancellation ends this loop: Redis or the storage failing only makes it
        wait (exponential backoff, capped) and try again.
        """
        self.log.info("consumer group starting", streams=self.streams)
        if self._side_by_side:
            self._parts = one_loop_per_stream(self)
            return await run_side_by_side(self, self._parts, stop)
        idle = True
        while not stop.is_set():
            try:
                if not self._groups_ready:
                    await self.ensure_groups()
                now = asyncio.get_running_loop().time()
                if self._storage_check_due(now, idle):
                    await self.handler.check_storage()
                    self._storage_checked_at = now
                if now - self._last_reclaim >= self.reclaim_interval_s or (
                    self._reclaim_walking and not self._claimed
                ):
                    self._last_reclaim = now
                    await self.reclaim()
                if self.lag_probe_s is not None and (
                    self._last_lag_probe is None or now - self._last_lag_probe >= self.lag_probe_s
                ):
                    self._last_lag_probe = now
                    await self.probe_lag()
                if self.tick is not None:
                    await self.tick()
                outcome = await self.process_next_batch(block_ms=self.block_ms)
                idle = outcome is None
                if self._outages:
                    self.log.info("servers are back", failed_tries=self._outages)
                    self._outages = 0
                if outcome is not None and outcome.retrying:
                    await sleep_unless_stopped(self._retry_delay(outcome.retrying), stop)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._outage(exc, stop)
        self.log.info("consumer group stopped")

    async def run_once(self) -> int:
        """Handle everything available now (pending entries included); return how many
        entries were finished (done or dead-lettered). Errors are raised, not retried."""
        await self.ensure_groups()
        await self.reclaim(whole=True)
        total = 0
        while True:
            outcome = await self.process_next_batch(block_ms=None)
            if outcome is None:
                return total
            total += outcome.finished
            if outcome.retrying:
                await asyncio.sleep(self._retry_delay(outcome.retrying))

    async def _outage(self, exc: Exception, stop: asyncio.Event) -> None:
        """Redis or the storage failed: count nothing against an entry, back off, go on."""
        self._outages += 1
        delay = self._backoff(self._outages)
        if isinstance(exc, self.handler.storage_errors):
            self._storage_checked_at = None
            self.log.warning("storage unavailable, retrying", error=str(exc), delay_s=delay)
        elif (condition := server_condition(exc)) is not None:
            REDIS_CONDITIONS.labels(condition.kind).inc()
            self.log.warning(
                "redis unavailable, retrying",
                condition=condition.kind,
                error=str(exc),
                advice=condition.message,
                delay_s=delay,
            )
        elif isinstance(exc, RedisError | OSError):
            if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                self._groups_ready = False
            self.log.warning("redis command failed, retrying", error=str(exc), delay_s=delay)
        else:
            self.log.exception("consumer step failed, retrying", delay_s=delay)
        await sleep_unless_stopped(delay, stop)

    def _storage_check_due(self, now: float, idle: bool) -> bool:
        checked = self._storage_checked_at
        return checked is None or (idle and now - checked >= self.storage_check_interval_s)

    async def ensure_groups(self) -> None:
        """Create the group at id ``0`` on every stream (if absent)."""
        for stream in self.streams:
            await ensure_group(self.redis, stream, self.group)
        self._groups_ready = True

    async def reclaim(self, *, whole: bool = False) -> int:
        """Take over entries idle ≥ ``reclaim_idle_ms`` in other (dead) consumers; they are
        handled before new ones. Returns how many were claimed.

        One page (``batch_size``) per stream, the cursor kept: the next page is claimed once
        this one is handled, so a long pending list is walked without holding it all. With
        ``whole``, every page until the cursors come back to the start."""
        claimed = 0
        for stream in self.streams:
            while True:
                reply: Any = await self.redis.xautoclaim(
                    stream,
                    self.group,
                    self.consumer,
                    self.reclaim_idle_ms,
                    start_id=self._reclaim_cursor[stream],
                    count=self.batch_size,
                )
                self._reclaim_cursor[stream] = cursor = text(reply[0])
                entries = stream_entries([(stream, reply[1])], self.raw_fields)
                if entries and self._reclaimed is not None:
                    disposed = await self._reclaimed(stream, entries)
                    entries = [e for e in entries if e.entry_id not in disposed]
                claimed += len(entries)
                self._claimed += entries
                if not whole or cursor == "0-0":
                    break
        if claimed:
            self.log.info("reclaimed idle entries", count=claimed)
        return claimed

    @property
    def _reclaim_walking(self) -> bool:
        """A reclaim walk is under way: its next page is due once the last one is handled."""
        return any(cursor != "0-0" for cursor in self._reclaim_cursor.values())

    async def probe_lag(self) -> None:
        """Set this group's lag and pending gauges on each of its streams."""
        await probe_group_lag(self.redis, self.group, self.streams)

    async def process_next_batch(self, block_ms: int | None) -> BatchOutcome | None:
        """Handle one batch (own pending entries first); None when idle.

        While a batch read with ``>`` is being finished, the next one is read and prepared.
        The batch read ahead is only used if this one finished cleanly; otherwise its entries
        are read again as pending.
        """
        batch, self._read_ahead = self._read_ahead, None
        try:
            if batch is None and self._claimed and not self._own_pending_from:
                entries = self._claimed[: self.batch_size]
                del self._claimed[: self.batch_size]
                batch = await self._prepare(entries)
            elif batch is None or self._own_pending_from:
                entries = await self._read_own_pending() if self._own_pending_from else []
                if not entries:
                    entries = await self._read(">", block_ms)
                if not entries:
                    return None
                batch = await self._prepare(entries)
        except (RedisError, OSError) as exc:
            # The read may have been delivered and its reply lost (a timeout, a frozen process,
            # a dropped connection): those entries are ours now, pending. Read them first.
            self.read_own_pending()
            self.log.warning("read failed, reading own pending entries first", error=str(exc))
            raise
        finishing = asyncio.ensure_future(self._finish(batch))
        try:
            if not self._own_pending_from:
                await self._read_next_batch()
            outcome = await finishing
        except BaseException:
            finishing.cancel()
            self.read_own_pending()  # whatever is unacknowledged is read again first
            raise
        if outcome.retrying:
            self.read_own_pending()
        return outcome

    async def _read_own_pending(self) -> list[StreamEntry]:
        """The next page of own pending entries of every stream, after the last one read; a
        stream with none left is done."""
        entries = await self._read_from(self._own_pending_from, None)
        last = {entry.stream: entry.entry_id for entry in entries}
        for stream in list(self._own_pending_from):
            if stream in last:
                self._own_pending_from[stream] = last[stream]
            else:
                del self._own_pending_from[stream]
        return entries

    async def _read_next_batch(self) -> None:
        """Read and prepare the next batch without waiting for one (see process_next_batch)."""
        try:
            entries = await self._read(">", None)
        except (RedisError, OSError) as exc:  # its entries are read again as own pending
            self.log.warning(
                "reading ahead failed, reading own pending entries first", error=str(exc)
            )
            self.read_own_pending()
            return
        if entries:
            self._read_ahead = await self._prepare(entries)

    async def _prepare(self, entries: Sequence[StreamEntry]) -> _Batch[B]:
        """Entries deleted (trimmed) while pending come back without fields: nothing is left
        to handle, they are only acknowledged."""
        self._deliveries.inc(len(entries))
        gone = [entry for entry in entries if not entry.fields]
        present = [entry for entry in entries if entry.fields] if gone else entries
        work = await self.handler.prepare(present) if present else None
        return _Batch(work, len(entries), gone)

    async def _finish(self, batch: _Batch[B]) -> BatchOutcome:
        self._batch_sizes.observe(batch.size)
        outcome = BatchOutcome() if batch.work is None else await self.handler.finish(batch.work)
        outcome.done.extend(batch.gone)
        if outcome.done:
            if not self.acknowledges or batch.gone:
                await self.ack(batch.gone if self.acknowledges else outcome.done)
            if self._attempts:
                for entry in outcome.done:
                    self._attempts.pop((entry.stream, entry.entry_id), None)
        for failure in outcome.failed:
            if (exc := failure.exc) is not None and (
                isinstance(exc, self.handler.storage_errors) or is_server_condition(exc)
            ):
                raise exc  # an outage met while handling it: nothing about the entry
        if outcome.rejected:
            await self.dead_letter([(r.entry, r.reason, r.error) for r in outcome.rejected])
            outcome.dead_lettered += len(outcome.rejected)
        for failure in outcome.failed:
            await self._failed(failure, outcome)
        return outcome

    async def _failed(self, failure: Failure, outcome: BatchOutcome) -> None:
        entry = failure.entry
        key = (entry.stream, entry.entry_id)
        now = asyncio.get_running_loop().time()
        attempts, first = self._attempts.get(key, (0, now))
        self._attempts[key] = (attempts := attempts + 1, first)
        bound = self.log.bind(
            stream=entry.stream, entry_id=entry.entry_id, attempts=attempts, **failure.context
        )
        if attempts >= self.max_attempts and now - first >= self.retry_window_s:
            bound.error("entry failed too often, dead-lettered", error=failure.error)
            reason = self.handler.failure_reason
            await self.dead_letter([(entry, reason, failure.error)], deliveries=attempts)
            self._attempts.pop(key, None)
            outcome.dead_lettered += 1
        else:
            bound.warning("entry failed, will retry", error=failure.error)
            outcome.retrying.append(entry)

    # -- redis -----------------------------------------------------------------------------------

    async def _read(self, start: str, block_ms: int | None) -> list[StreamEntry]:
        return await self._read_from(dict.fromkeys(self.streams, start), block_ms)

    async def _read_from(
        self, positions: Mapping[str, str], block_ms: int | None
    ) -> list[StreamEntry]:
        return await read_group(
            self.redis,
            self.group,
            self.consumer,
            positions,
            count=self.batch_size,
            block_ms=block_ms,
            split=self._split_reads,
            raw_fields=self.raw_fields,
        )

    async def ack(self, entries: Sequence[StreamEntry]) -> None:
        by_stream: dict[str, list[str]] = {}
        for entry in entries:
            by_stream.setdefault(entry.stream, []).append(entry.entry_id)
        pipe = self.redis.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            pipe.xack(stream, self.group, *ids)
        await pipe.execute()

    async def dead_letter(
        self, items: Sequence[tuple[StreamEntry, str, str]], deliveries: int = 1
    ) -> None:
        """Each ``(entry, reason, error)`` to its stream's DLQ, atomically with its XACK."""
        await dead_letter_entries(
            self.redis, self.group, self.handler.dlq_stream, items, deliveries, self.log
        )

    # -- timing ----------------------------------------------------------------------------------

    def _backoff(self, failures: int) -> float:
        return backoff_delay(failures, self.backoff_initial_s, self.backoff_max_s)

    def _retry_delay(self, retrying: Sequence[StreamEntry]) -> float:
        worst = max(self._attempts.get((e.stream, e.entry_id), (1, 0.0))[0] for e in retrying)
        return self._backoff(worst)
