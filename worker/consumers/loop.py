"""One consumer-group loop for every Redis Streams group memworker runs.

The consolidator (group ``consolidation`` on every ``P:results:{i}``), the indexer (on
``P:episodes``) and lifecycle hooks (a user's group on every ``P:results:{i}``) differ only in
what they do with a batch of entries. Everything else is here, once:

- **Groups**: created at id ``0`` (``MKSTREAM``) on every stream, and again when Redis answers
  ``NOGROUP`` (a stream deleted, a restarted Redis without persistence).
- **Own pending first**: after a (re)start, or after a batch did not finish cleanly, this
  consumer's own unacknowledged entries (read with id ``0``) come before new ones (``>``).
- **Read-ahead**: while a batch is being finished (a Postgres COMMIT, a callback), the next
  one is read and prepared, so the store and Python work at once. It is used only if the batch
  in hand finished cleanly; otherwise its entries are read again as pending.
- **Reclaim**: entries idle ``reclaim_idle_ms`` in another consumer (one that died) are taken
  over with ``XAUTOCLAIM`` (a cursor per stream, so a long pending list is walked, not
  restarted) and then read as own pending.
- **Delivery cap**: an entry the handler reports *failed* is retried with backoff; after
  ``max_attempts`` failures it is dead-lettered (``worker.consumers.dead_letters``: XADD to the
  DLQ and XACK in one MULTI) with the handler's reason, the last error and its provenance. An
  entry the handler reports *rejected* (it can never be handled: unparseable, invalid) is
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
- **Stop**: ``run(stop)`` finishes the batch in hand and returns; its sleeps wake at once when
  ``stop`` is set (a blocking read returns within ``block_ms``).
- **Side work**: ``tick`` (optional) is awaited once per turn of ``run``, between batches (never
  while one is being finished); it must be cheap when it has nothing to do and must not raise
  for a server-wide condition: the consolidator's announcement relay is one.
- **Metrics**: dead letters (``memworker_dead_letters_total{group,reason}``) and entries per
  batch (``memworker_batch_size{group}``); the handler counts its own work in ``finish``.

The handler (``GroupHandler``) supplies the group and its streams, the DLQ of a stream, how to
prepare a batch (``prepare``: parse, build rows; no I/O needed) and how to finish it
(``finish``: store it, and say which entries are done, rejected or failed; the loop then
acknowledges, dead-letters and counts), which exceptions mean "storage unavailable", and how
to check the storage. A minimal handler, printing each entry::

    class Printer:
        group = "printer"
        streams = ("demo:results:{0}",)
        storage_errors: tuple[type[BaseException], ...] = ()
        failure_reason = "print_failed"

        def dlq_stream(self, stream: str) -> str:
            return "demo:dlq:{0}"

        async def prepare(self, entries: Sequence[StreamEntry]) -> Sequence[StreamEntry]:
            return entries

        async def finish(self, batch: Sequence[StreamEntry]) -> BatchOutcome:
            outcome = BatchOutcome()
            for entry in batch:
                if b"data" not in entry.fields and "data" not in entry.fields:
                    outcome.rejected.append(Rejection(entry, "unparseable", "no 'data'"))
                    continue
                print(entry.entry_id, entry.fields)
                outcome.done.append(entry)
            return outcome

        async def check_storage(self) -> None:
            pass

    await GroupConsumer(redis, Printer()).run(stop)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from worker.consumers.dead_letters import dead_letter, queue_dead_letter
from worker.logs import get_logger
from worker.metrics import BATCH_SIZE, DEAD_LETTERS, REDIS_CONDITIONS
from worker.redis_conditions import is_server_condition, server_condition

log = get_logger("worker.consumers.loop")


class StorageUnavailableError(RuntimeError):
    """The handler's storage does not answer; nothing was acknowledged, the batch is retried."""


def default_consumer_name() -> str:
    """Unique per process, so a restarted process never inherits a dead one's identity."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class StreamEntry:
    stream: str
    entry_id: str
    fields: dict[str, bytes | str]


@dataclass(frozen=True, slots=True)
class Rejection:
    """An entry that can never be handled: dead-lettered at once with ``reason``."""

    entry: StreamEntry
    reason: str
    error: str


@dataclass(frozen=True, slots=True)
class Failure:
    """An entry whose handling failed this time: retried, dead-lettered after the cap.
    ``context`` is logged with it (ids that help a person find it)."""

    entry: StreamEntry
    error: str
    context: Mapping[str, Any] = field(default_factory=dict)
    exc: BaseException | None = None
    """The exception, if any: a server-wide Redis condition or a storage error here is an
    outage, not the entry's failure (the batch is retried and no attempt is counted)."""


@dataclass(slots=True)
class BatchOutcome:
    """What became of a batch. The handler fills ``done`` (stored: the loop acknowledges
    them), ``rejected`` and ``failed``; the loop fills ``dead_lettered`` and ``retrying``."""

    done: list[StreamEntry] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    dead_lettered: int = 0
    retrying: list[StreamEntry] = field(default_factory=list)

    @property
    def finished(self) -> int:
        """Entries acknowledged: done or dead-lettered."""
        return len(self.done) + self.dead_lettered


B = TypeVar("B")


class GroupHandler(Protocol[B]):
    """What a consumer group does with its entries (see the module docstring)."""

    @property
    def group(self) -> str: ...

    @property
    def streams(self) -> Sequence[str]: ...

    @property
    def storage_errors(self) -> tuple[type[BaseException], ...]:
        """Exceptions of ``finish``/``check_storage`` that mean "storage unavailable"."""
        ...

    @property
    def failure_reason(self) -> str:
        """The DLQ ``reason`` of an entry that failed ``max_attempts`` times."""
        ...

    def dlq_stream(self, stream: str) -> str: ...

    async def prepare(self, entries: Sequence[StreamEntry]) -> B:
        """Turn entries (each with fields) into a batch; must not raise for a bad entry."""
        ...

    async def finish(self, batch: B) -> BatchOutcome:
        """Store the batch; raise one of ``storage_errors`` if the storage is unavailable."""
        ...

    async def check_storage(self) -> None:
        """Raise one of ``storage_errors`` unless the storage can be used now."""
        ...


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
        tick: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.redis = redis
        self.tick = tick
        self.handler = handler
        self.group = handler.group
        self.streams = list(handler.streams)
        self.consumer = consumer or default_consumer_name()
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.max_attempts = max_attempts
        self.reclaim_idle_ms = reclaim_idle_ms
        self.reclaim_interval_s = reclaim_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.storage_check_interval_s = storage_check_interval_s
        self._attempts: dict[tuple[str, str], int] = {}
        self._read_own_pending = True
        self._read_ahead: _Batch[B] | None = None
        self._groups_ready = False
        self._storage_checked_at: float | None = None
        self._reclaim_cursor = dict.fromkeys(self.streams, "0-0")
        self._last_reclaim = 0.0
        self._outages = 0
        self._split_reads = isinstance(redis, RedisCluster) and len(self.streams) > 1
        self.log = log.bind(group=self.group, consumer=self.consumer)

    # -- state -----------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Its groups exist and the last step reached Redis and the storage."""
        return self._groups_ready and self._storage_checked_at is not None and self._outages == 0

    # -- the loop --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; the batch in hand is finished first.

        Nothing but cancellation ends this loop: Redis or the storage failing only makes it
        wait (exponential backoff, capped) and try again.
        """
        self.log.info("consumer group starting", streams=self.streams)
        idle = True
        while not stop.is_set():
            try:
                if not self._groups_ready:
                    await self.ensure_groups()
                now = asyncio.get_running_loop().time()
                if self._storage_check_due(now, idle):
                    await self.handler.check_storage()
                    self._storage_checked_at = now
                if now - self._last_reclaim >= self.reclaim_interval_s:
                    self._last_reclaim = now
                    await self.reclaim()
                if self.tick is not None:
                    await self.tick()
                outcome = await self.process_next_batch(block_ms=self.block_ms)
                idle = outcome is None
                if self._outages:
                    self.log.info("servers are back", failed_tries=self._outages)
                    self._outages = 0
                if outcome is not None and outcome.retrying:
                    await self._sleep(self._retry_delay(outcome.retrying), stop)
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
        await self._sleep(delay, stop)

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
        then read with this consumer's pending entries. Returns how many were claimed.

        One page (``batch_size``) per stream, the cursor kept for the next call; with
        ``whole``, every page until the cursors come back to the start."""
        claimed = 0
        for stream in self.streams:
            while True:
                reply = await self.redis.xautoclaim(
                    stream,
                    self.group,
                    self.consumer,
                    self.reclaim_idle_ms,
                    start_id=self._reclaim_cursor[stream],
                    count=self.batch_size,
                )
                next_start, entries = _text(reply[0]), reply[1]
                self._reclaim_cursor[stream] = next_start
                claimed += len(entries)
                if not whole or next_start == "0-0":
                    break
        if claimed:
            self._read_own_pending = True
            self.log.info("reclaimed idle entries", count=claimed)
        return claimed

    async def process_next_batch(self, block_ms: int | None) -> BatchOutcome | None:
        """Handle one batch (own pending entries first); None when idle.

        While a batch read with ``>`` is being finished, the next one is read and prepared.
        The batch read ahead is only used if this one finished cleanly; otherwise its entries
        are read again as pending.
        """
        batch, self._read_ahead = self._read_ahead, None
        if batch is None or self._read_own_pending:
            entries: list[StreamEntry] = []
            if self._read_own_pending:
                entries = await self._read("0", None)
                if not entries:
                    self._read_own_pending = False
            if not entries:
                entries = await self._read(">", block_ms)
            if not entries:
                return None
            batch = await self._prepare(entries)
        finishing = asyncio.ensure_future(self._finish(batch))
        try:
            if not self._read_own_pending:
                await self._read_next_batch()
            outcome = await finishing
        except BaseException:
            finishing.cancel()
            self._read_ahead = None
            self._read_own_pending = True  # whatever is unacknowledged is read again first
            raise
        if outcome.retrying:
            self._read_ahead = None
            self._read_own_pending = True
        return outcome

    async def _read_next_batch(self) -> None:
        """Read and prepare the next batch without waiting for one (see process_next_batch)."""
        try:
            entries = await self._read(">", None)
        except (RedisError, OSError) as exc:  # the next read meets it again, and reports it
            self.log.debug("reading ahead failed", error=str(exc))
            self._read_own_pending = True
            return
        if entries:
            self._read_ahead = await self._prepare(entries)

    async def _prepare(self, entries: Sequence[StreamEntry]) -> _Batch[B]:
        """Entries deleted (trimmed) while pending come back without fields: nothing is left
        to handle, they are only acknowledged."""
        gone = [entry for entry in entries if not entry.fields]
        present = [entry for entry in entries if entry.fields] if gone else entries
        work = await self.handler.prepare(present) if present else None
        return _Batch(work, len(entries), gone)

    async def _finish(self, batch: _Batch[B]) -> BatchOutcome:
        BATCH_SIZE.labels(self.group).observe(batch.size)
        outcome = BatchOutcome() if batch.work is None else await self.handler.finish(batch.work)
        outcome.done.extend(batch.gone)
        if outcome.done:
            await self.ack(outcome.done)
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
        attempts = self._attempts.get(key, 0) + 1
        self._attempts[key] = attempts
        bound = self.log.bind(
            stream=entry.stream, entry_id=entry.entry_id, attempts=attempts, **failure.context
        )
        if attempts >= self.max_attempts:
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
        if self._split_reads:
            # Shards live on different nodes: one XREADGROUP may not span them (CROSSSLOT).
            reply: Any = []
            for stream in self.streams:
                part: Any = await self.redis.xreadgroup(
                    self.group, self.consumer, {stream: start}, count=self.batch_size
                )
                reply += list(part.items()) if isinstance(part, dict) else list(part or [])
            if not any(entries for _stream, entries in reply) and block_ms:
                await asyncio.sleep(block_ms / 1000)
        else:
            reply = await self.redis.xreadgroup(
                self.group,
                self.consumer,
                dict.fromkeys(self.streams, start),
                count=self.batch_size,
                block=block_ms,
            )
        if not reply:
            return []
        pairs: Iterable[tuple[Any, Any]] = reply.items() if isinstance(reply, dict) else reply
        entries: list[StreamEntry] = []
        for stream, stream_entries in pairs:
            if (
                stream_entries
                and isinstance(stream_entries[0], list | tuple)
                and not isinstance(stream_entries[0][0], bytes | str)
            ):  # RESP3 nests one level deeper
                stream_entries = stream_entries[0]
            name = _text(stream)
            for entry_id, fields in stream_entries:
                entries.append(
                    StreamEntry(
                        name, _text(entry_id), {_text(k): v for k, v in (fields or {}).items()}
                    )
                )
        return entries

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
        """Each ``(entry, reason, error)`` to its stream's DLQ, atomically with its XACK (one
        MULTI per stream)."""
        by_stream: dict[str, list[tuple[StreamEntry, str, str]]] = {}
        for item in items:
            by_stream.setdefault(item[0].stream, []).append(item)
        for stream, stream_items in by_stream.items():
            pipe = self.redis.pipeline(transaction=True)
            for entry, reason, error in stream_items:
                DEAD_LETTERS.labels(self.group, reason).inc()
                self.log.warning(
                    "entry dead-lettered", stream=stream, entry_id=entry.entry_id, reason=reason
                )
                letter = dead_letter(
                    fields=dict(entry.fields),
                    source_stream=stream,
                    source_id=entry.entry_id,
                    group=self.group,
                    reason=reason,
                    error=error,
                    deliveries=deliveries,
                )
                queue_dead_letter(pipe, self.handler.dlq_stream(stream), letter)
            await pipe.execute()

    # -- timing ----------------------------------------------------------------------------------

    def _backoff(self, failures: int) -> float:
        return float(min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(failures - 1, 30)))

    def _retry_delay(self, retrying: Sequence[StreamEntry]) -> float:
        worst = max(self._attempts.get((e.stream, e.entry_id), 1) for e in retrying)
        return self._backoff(worst)

    @staticmethod
    async def _sleep(seconds: float, stop: asyncio.Event) -> None:
        """Sleep, but wake at once when asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)


async def ensure_group(redis: Redis | RedisCluster, stream: str, group: str) -> None:
    """Create ``group`` at id ``0`` on ``stream`` (and the stream) unless it exists.

    A full Redis refuses XGROUP CREATE even for a group that exists: then the group is looked
    up, so a consumer restarted while Redis is full starts (and holds its entries)."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return
        if not is_server_condition(exc) or not await _group_exists(redis, stream, group):
            raise


async def _group_exists(redis: Redis | RedisCluster, stream: str, group: str) -> bool:
    try:
        groups: Any = await redis.xinfo_groups(stream)
    except ResponseError:
        return False
    return any(_text(g["name"]) == group for g in groups)
