"""The consolidator: results from ``P:results:{i}`` into Postgres, then ``episode.recorded``.

Why it is shaped this way:

- **Commit, then acknowledge.** A batch is written in one transaction (``INSERT … ON CONFLICT
  DO NOTHING``), and its entries are acknowledged only after the COMMIT. A crash anywhere leaves
  them pending; the redelivery conflicts with the rows already there and writes nothing twice.
- **An outbox flag for ``episode.recorded``.** ``episodes.announced_at`` is null until the event
  is published, so a crash between COMMIT and XADD publishes it on redelivery instead of never;
  a replay of an announced episode publishes nothing. (At least once, exactly once without a
  crash; the event's ``event_id`` is deterministic, so subscribers can drop a duplicate.)
- **Postgres down is not a poison entry.** When a write fails, ``SELECT 1`` tells the two
  apart. Down: nothing is acknowledged and the loop backs off (capped) until it answers. Up: the
  batch is split in halves until the failing entry stands alone; it is retried with backoff and
  dead-lettered (``storage_failed``) after ``consolidation_max_attempts`` failures.
- **FastStream's gaps** (DESIGN.md): this process's own pending entries are read first (id
  ``0``), entries of dead consumers are taken over with ``XAUTOCLAIM``, consumer names are
  unique per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError
from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.results import RESULT_ADAPTER, AgentTerminated, Result
from schemas.streams import EpisodeRecorded
from worker.connections import redis_client
from worker.context_summary import build_context_summary
from worker.db.engine import create_database_engine
from worker.db.models import EPISODE_NAMESPACE, Episode, LifecycleEvent, episode_id_for
from worker.dlq import dead_letter, queue_dead_letter
from worker.keys import CONSOLIDATION_GROUP, StreamKeys, episodes_stream
from worker.logs import get_logger
from worker.settings import Settings

log = get_logger("worker.consolidator")

FASTSTREAM_DATA_FIELD = "__data__"


class StorageUnavailableError(RuntimeError):
    """Postgres does not answer; nothing was acknowledged, the batch will be retried."""


class UnusableEntryError(ValueError):
    """A stream entry that can never become a row: its DLQ ``reason`` says why."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class StreamEntry:
    stream: str
    entry_id: str
    fields: dict[str, bytes | str]


@dataclass(frozen=True, slots=True)
class ParsedResult:
    entry: StreamEntry
    payload: dict[str, Any]
    result: Result


@dataclass(frozen=True, slots=True)
class Announcement:
    episode_id: uuid.UUID
    project_id: str
    session_id: str
    source_event_id: str

    def event(self) -> EpisodeRecorded:
        return EpisodeRecorded(
            event_id=str(uuid.uuid5(EPISODE_NAMESPACE, f"episode.recorded:{self.episode_id}")),
            episode_id=str(self.episode_id),
            project_id=self.project_id,
            session_id=self.session_id,
            causation_id=self.source_event_id,
        )


@dataclass(slots=True)
class BatchOutcome:
    """What became of the entries of one batch."""

    stored: int = 0
    dead_lettered: int = 0
    episodes_announced: int = 0
    retrying: list[StreamEntry] = field(default_factory=list)

    @property
    def finished(self) -> int:
        return self.stored + self.dead_lettered


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _wire_fields(entry: StreamEntry) -> dict[bytes | str, bytes | str]:
    return {key: value for key, value in entry.fields.items()}


def decode_entry(fields: Mapping[str, bytes | str]) -> dict[str, Any]:
    """The result object of an entry: its ``data`` field, or FastStream's ``__data__`` body."""
    raw = fields.get("data")
    if raw is None and (envelope := fields.get(FASTSTREAM_DATA_FIELD)) is not None:
        from faststream.redis.parser.binary import BinaryMessageFormatV1

        raw, _headers = BinaryMessageFormatV1.parse(
            envelope if isinstance(envelope, bytes) else envelope.encode()
        )
    if raw is None:
        raise UnusableEntryError("unparseable", "the entry has no 'data' field")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UnusableEntryError("unparseable", f"'data' is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise UnusableEntryError("unparseable", "'data' is not a JSON object")
    return value


class SnapshotShape(BaseModel):
    """The snapshot's structure, checked without validating each value as JSON again (it came
    out of a JSON parser): a full ``Snapshot`` validation costs more than the INSERT."""

    variables: dict[str, Any]
    task_state: dict[str, Any] | None = None
    scratchpad: list[dict[str, Any]]
    checkpoints: list[str]


_SNAPSHOT_SHAPE = TypeAdapter(SnapshotShape)


def parse_result(payload: dict[str, Any]) -> Result:
    """The validated result; a ``snapshot`` is shape-checked apart (see ``SnapshotShape``)."""
    snapshot = payload.get("snapshot")
    try:
        if snapshot is None:
            result = RESULT_ADAPTER.validate_python(payload)
        else:
            result = RESULT_ADAPTER.validate_python({**payload, "snapshot": None})
            _SNAPSHOT_SHAPE.validate_python(snapshot)
    except ValidationError as exc:
        raise UnusableEntryError("invalid_result", str(exc)) from exc
    needs_ids = isinstance(result, AgentTerminated) and result.consolidate
    if needs_ids and (not result.project_id or not result.session_id):
        raise UnusableEntryError(
            "invalid_result", "agent.terminated with consolidate needs project_id, session_id"
        )
    return result


def event_row(parsed: ParsedResult) -> dict[str, Any]:
    result = parsed.result
    return {
        "event_id": result.event_id,
        "type": result.type,
        "project_id": result.project_id,
        "session_id": result.session_id,
        "agent_instance_id": result.agent_instance_id,
        "causation_id": result.causation_id,
        "command": result.command,
        "seq": result.seq,
        "occurred_at": _aware(result.occurred_at),
        "payload": event_payload(parsed.payload),
    }


def event_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The result as stored in ``lifecycle_events``: all of it but the snapshot, which is
    kept once, in ``episodes.snapshot`` (it can be most of the bytes)."""
    if "snapshot" not in payload:
        return payload
    return {k: v for k, v in payload.items() if k != "snapshot"}


def episode_row(parsed: ParsedResult, summary_max_chars: int) -> dict[str, Any]:
    result = parsed.result
    assert isinstance(result, AgentTerminated)
    return {
        "id": episode_id_for(result.event_id),
        "source_event_id": result.event_id,
        "project_id": result.project_id,
        "session_id": result.session_id,
        "agent_instance_id": result.agent_instance_id,
        "agent_type_id": result.agent_type_id,
        "task_description": result.task_description,
        "outcome": result.outcome,
        "lessons_learned": list(result.lessons_learned),
        "context_summary": build_context_summary(
            result, parsed.payload.get("snapshot"), summary_max_chars
        ),
        "snapshot": parsed.payload.get("snapshot"),
        "tokens_used": result.tokens_used,
        "importance_score": result.importance,
        "duration_seconds": result.duration_seconds,
        "started_at": _aware(result.started_at),
        "occurred_at": _aware(result.occurred_at),
    }


def is_connection_error(exc: BaseException) -> bool:
    """True for failures that say nothing about the data: the server is gone or going."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OSError | ConnectionError | TimeoutError)


def default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Consolidator:
    """Consumes ``P:results:{i}`` of every shard in group ``consolidation`` into Postgres."""

    def __init__(
        self,
        settings: Settings,
        redis: Redis,
        engine: AsyncEngine,
        *,
        consumer: str | None = None,
        batch_size: int | None = None,
        block_ms: int = 1_000,
        reclaim_idle_ms: int = 60_000,
        reclaim_interval_s: float = 5.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 10.0,
        probe_timeout_s: float = 5.0,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.engine = engine
        self.consumer = consumer or default_consumer_name()
        self.batch_size = batch_size or settings.consolidation_batch_size
        self.block_ms = block_ms
        self.reclaim_idle_ms = reclaim_idle_ms
        self.reclaim_interval_s = reclaim_interval_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.probe_timeout_s = probe_timeout_s
        self.streams = [StreamKeys(settings.stream_prefix, i) for i in range(settings.shards)]
        self._dlq_of = {keys.results: keys.dlq for keys in self.streams}
        self._episodes_stream = episodes_stream(settings.stream_prefix)
        self._attempts: dict[tuple[str, str], int] = {}
        self._read_own_pending = True
        self._groups_ready = False
        self._reclaim_cursor = {keys.results: "0-0" for keys in self.streams}
        self._last_reclaim = 0.0
        self._outages = 0
        self._owns_clients = False
        self.log = log.bind(consumer=self.consumer)

    # -- public --------------------------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> Consolidator:
        """A consolidator with its own Redis client and engine (closed by ``close``)."""
        consolidator = cls(
            settings,
            redis_client(settings.redis_url),
            create_database_engine(settings.database_url),
            **options,
        )
        consolidator._owns_clients = True
        return consolidator

    async def close(self) -> None:
        if self._owns_clients:
            await self.redis.aclose()
            await self.engine.dispose()

    def is_ready(self) -> bool:
        """Ready when its groups exist and the last step reached both Redis and Postgres."""
        return self._groups_ready and self._outages == 0

    async def replay(self, entries: Sequence[StreamEntry]) -> BatchOutcome:
        """Store ``entries`` again (a replay): idempotent; junk is skipped, not dead-lettered."""
        outcome = BatchOutcome()
        parsed: list[ParsedResult] = []
        for entry in entries:
            if not entry.fields:
                continue
            try:
                payload = decode_entry(entry.fields)
                parsed.append(ParsedResult(entry, payload, parse_result(payload)))
            except UnusableEntryError:
                outcome.dead_lettered += 1
        if parsed:
            await self._store(parsed, outcome)
        return outcome

    async def ensure_groups(self) -> None:
        """Create group ``consolidation`` at id ``0`` on every results stream (if absent)."""
        for keys in self.streams:
            try:
                await self.redis.xgroup_create(
                    keys.results, CONSOLIDATION_GROUP, id="0", mkstream=True
                )
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._groups_ready = True

    async def run_once(self) -> int:
        """Consolidate everything available now (pending entries included); return how many
        entries were finished (stored or dead-lettered). Raises StorageUnavailableError."""
        await self.ensure_groups()
        await self.reclaim()
        total = 0
        while True:
            outcome = await self.process_next_batch(block_ms=None)
            if outcome is None:
                return total
            total += outcome.finished
            if outcome.retrying:
                await asyncio.sleep(self._retry_delay(outcome.retrying))

    async def run(self, stop: asyncio.Event) -> None:
        """Consolidate until ``stop`` is set; the batch in hand is finished first.

        Nothing but cancellation ends this loop: Postgres or Redis failing only makes it wait
        (exponential backoff, capped) and try again.
        """
        self.log.info("consolidator starting", streams=[k.results for k in self.streams])
        while not stop.is_set():
            try:
                if not self._groups_ready:
                    await self.ensure_groups()
                loop_time = asyncio.get_running_loop().time()
                if loop_time - self._last_reclaim >= self.reclaim_interval_s:
                    self._last_reclaim = loop_time
                    await self.reclaim()
                outcome = await self.process_next_batch(block_ms=self.block_ms)
                if self._outages:
                    self.log.info("postgres is back", failed_tries=self._outages)
                    self._outages = 0
                if outcome is not None and outcome.retrying:
                    await self._sleep(self._retry_delay(outcome.retrying), stop)
            except asyncio.CancelledError:
                raise
            except StorageUnavailableError as exc:
                self._outages += 1
                delay = self._backoff(self._outages)
                self.log.warning(
                    "postgres unavailable, retrying", error=str(exc.__cause__ or exc), delay_s=delay
                )
                await self._sleep(delay, stop)
            except (RedisError, OSError) as exc:
                self._outages += 1
                if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                    self._groups_ready = False
                delay = self._backoff(self._outages)
                self.log.warning("redis unavailable, retrying", error=str(exc), delay_s=delay)
                await self._sleep(delay, stop)
            except Exception:
                self._outages += 1
                delay = self._backoff(self._outages)
                self.log.exception("consolidation step failed, retrying", delay_s=delay)
                await self._sleep(delay, stop)
        self.log.info("consolidator stopped")

    async def reclaim(self) -> int:
        """Take over entries idle ≥ ``reclaim_idle_ms`` in other (dead) consumers; they are
        then read with this consumer's pending entries. Returns how many were claimed."""
        claimed = 0
        for keys in self.streams:
            stream = keys.results
            reply = await self.redis.xautoclaim(
                stream,
                CONSOLIDATION_GROUP,
                self.consumer,
                self.reclaim_idle_ms,
                start_id=self._reclaim_cursor[stream],
                count=self.batch_size,
            )
            next_start, entries = reply[0], reply[1]
            self._reclaim_cursor[stream] = _text(next_start)
            claimed += len(entries)
        if claimed:
            self._read_own_pending = True
            self.log.info("reclaimed idle entries", count=claimed)
        return claimed

    async def process_next_batch(self, block_ms: int | None) -> BatchOutcome | None:
        """Read one batch (own pending entries first) and consolidate it; None when idle."""
        entries: list[StreamEntry] = []
        if self._read_own_pending:
            entries = await self._read("0", None)
            if not entries:
                self._read_own_pending = False
        if not entries:
            entries = await self._read(">", block_ms)
        if not entries:
            return None
        try:
            outcome = await self.consolidate(entries)
        except BaseException:
            self._read_own_pending = True  # whatever is unacknowledged is read again first
            raise
        if outcome.retrying:
            self._read_own_pending = True
        return outcome

    async def consolidate(self, entries: Sequence[StreamEntry]) -> BatchOutcome:
        """Write ``entries`` (all read in this group by this consumer) and acknowledge them."""
        outcome = BatchOutcome()
        parsed: list[ParsedResult] = []
        dead: list[tuple[StreamEntry, UnusableEntryError]] = []
        gone: list[StreamEntry] = []
        for entry in entries:
            if not entry.fields:  # deleted (trimmed) while pending: nothing left to store
                gone.append(entry)
                continue
            try:
                payload = decode_entry(entry.fields)
                parsed.append(ParsedResult(entry, payload, parse_result(payload)))
            except UnusableEntryError as exc:
                dead.append((entry, exc))
        if gone:
            await self._ack(gone)
            outcome.stored += len(gone)
        if dead:
            await self._dead_letter([(entry, exc.reason, str(exc)) for entry, exc in dead])
            outcome.dead_lettered += len(dead)
        if parsed:
            await self._store(parsed, outcome)
        return outcome

    # -- storing -------------------------------------------------------------------------------

    async def _store(self, parsed: Sequence[ParsedResult], outcome: BatchOutcome) -> None:
        """Write ``parsed`` in one transaction; on a data error split it to isolate the culprit."""
        try:
            announcements = await self._write(parsed)
        except Exception as exc:
            if is_connection_error(exc) or not await self._storage_answers():
                raise StorageUnavailableError(str(exc)) from exc
            if len(parsed) > 1:
                middle = len(parsed) // 2
                await self._store(parsed[:middle], outcome)
                await self._store(parsed[middle:], outcome)
                return
            await self._failed_alone(parsed[0], exc, outcome)
            return
        await self._announce(announcements)
        await self._ack([p.entry for p in parsed])
        for p in parsed:
            self._attempts.pop((p.entry.stream, p.entry.entry_id), None)
        outcome.stored += len(parsed)
        outcome.episodes_announced += len(announcements)

    async def _write(self, parsed: Sequence[ParsedResult]) -> list[Announcement]:
        events: dict[str, dict[str, Any]] = {}
        episodes: dict[str, dict[str, Any]] = {}
        max_chars = self.settings.context_summary_max_chars
        for p in parsed:
            events.setdefault(p.result.event_id, event_row(p))
            consolidate = isinstance(p.result, AgentTerminated) and p.result.consolidate
            if consolidate and p.result.event_id not in episodes:
                episodes[p.result.event_id] = episode_row(p, max_chars)
        announcements: list[Announcement] = []
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(LifecycleEvent).on_conflict_do_nothing(), list(events.values())
            )
            if not episodes:
                return announcements
            inserted = await conn.execute(
                insert(Episode)
                .on_conflict_do_nothing()
                .returning(
                    Episode.id, Episode.project_id, Episode.session_id, Episode.source_event_id
                ),
                list(episodes.values()),
            )
            announcements += [Announcement(*row) for row in inserted.all()]
            new = {a.source_event_id for a in announcements}
            conflicted = [source for source in episodes if source not in new]
            if conflicted:  # replayed, or redelivered after a crash before publishing
                owed = await conn.execute(
                    select(
                        Episode.id, Episode.project_id, Episode.session_id, Episode.source_event_id
                    ).where(Episode.source_event_id.in_(conflicted), Episode.announced_at.is_(None))
                )
                announcements += [Announcement(*row) for row in owed.all()]
        return announcements

    async def _announce(self, announcements: Sequence[Announcement]) -> None:
        """Publish ``episode.recorded``, then mark the episodes announced."""
        if not announcements:
            return
        pipe = self.redis.pipeline(transaction=False)
        for announcement in announcements:
            pipe.xadd(self._episodes_stream, {"data": announcement.event().model_dump_json()})
        await pipe.execute()
        try:
            async with self.engine.begin() as conn:
                await conn.execute(
                    update(Episode)
                    .where(Episode.id.in_([a.episode_id for a in announcements]))
                    .values(announced_at=text("now()"))
                )
        except Exception as exc:
            raise StorageUnavailableError(str(exc)) from exc

    async def _storage_answers(self) -> bool:
        try:
            async with asyncio.timeout(self.probe_timeout_s), self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception:
            return False
        return True

    async def _failed_alone(
        self, parsed: ParsedResult, exc: Exception, outcome: BatchOutcome
    ) -> None:
        entry = parsed.entry
        key = (entry.stream, entry.entry_id)
        attempts = self._attempts.get(key, 0) + 1
        self._attempts[key] = attempts
        error = str(exc.__cause__ or exc).splitlines()[0] if str(exc) else repr(exc)
        bound = self.log.bind(
            stream=entry.stream,
            entry_id=entry.entry_id,
            event_id=parsed.result.event_id,
            project_id=parsed.result.project_id,
            session_id=parsed.result.session_id,
            attempts=attempts,
        )
        if attempts >= self.settings.consolidation_max_attempts:
            bound.error("result could not be stored, dead-lettered", error=error)
            await self._dead_letter([(entry, "storage_failed", error)], deliveries=attempts)
            self._attempts.pop(key, None)
            outcome.dead_lettered += 1
        else:
            bound.warning("result could not be stored, will retry", error=error)
            outcome.retrying.append(entry)

    # -- redis ---------------------------------------------------------------------------------

    async def _read(self, start: str, block_ms: int | None) -> list[StreamEntry]:
        reply: Any = await self.redis.xreadgroup(
            CONSOLIDATION_GROUP,
            self.consumer,
            {keys.results: start for keys in self.streams},
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
            for entry_id, fields in stream_entries:
                entries.append(
                    StreamEntry(
                        _text(stream),
                        _text(entry_id),
                        {_text(k): v for k, v in (fields or {}).items()},
                    )
                )
        return entries

    async def _ack(self, entries: Sequence[StreamEntry]) -> None:
        by_stream: dict[str, list[str]] = {}
        for entry in entries:
            by_stream.setdefault(entry.stream, []).append(entry.entry_id)
        pipe = self.redis.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            pipe.xack(stream, CONSOLIDATION_GROUP, *ids)
        await pipe.execute()

    async def _dead_letter(
        self, items: Sequence[tuple[StreamEntry, str, str]], deliveries: int = 1
    ) -> None:
        """Each to its shard's DLQ, atomically with its XACK (one MULTI per shard)."""
        by_stream: dict[str, list[tuple[StreamEntry, str, str]]] = {}
        for item in items:
            by_stream.setdefault(item[0].stream, []).append(item)
        for stream, stream_items in by_stream.items():
            pipe = self.redis.pipeline(transaction=True)
            for entry, reason, error in stream_items:
                self.log.warning(
                    "entry dead-lettered", stream=stream, entry_id=entry.entry_id, reason=reason
                )
                letter = dead_letter(
                    fields=_wire_fields(entry),
                    source_stream=stream,
                    source_id=entry.entry_id,
                    group=CONSOLIDATION_GROUP,
                    reason=reason,
                    error=error,
                    deliveries=deliveries,
                )
                queue_dead_letter(pipe, self._dlq_of[stream], letter)
            await pipe.execute()

    # -- timing --------------------------------------------------------------------------------

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


async def replay_results(
    redis: Redis,
    settings: Settings,
    shard: int,
    start: str = "-",
    end: str = "+",
    progress: Callable[[int], None] | None = None,
) -> Counter[str]:
    """Re-store a range of ``P:results:{shard}`` into Postgres; counts of what changed.

    ``results`` entries were read; ``new_episodes`` episodes did not exist before (or were
    never announced); ``skipped`` entries were not results.
    """
    from worker.replay import read_range

    consolidator = Consolidator(
        settings, redis, create_database_engine(settings.database_url), consumer="replay"
    )
    stream = StreamKeys(settings.stream_prefix, shard).results
    counts: Counter[str] = Counter()
    try:
        async for rows in read_range(redis, stream, start, end, settings.consolidation_batch_size):
            entries = [
                StreamEntry(stream, _text(i), {_text(k): v for k, v in f.items()}) for i, f in rows
            ]
            outcome = await consolidator.replay(entries)
            counts["results"] += outcome.stored
            counts["new_episodes"] += outcome.episodes_announced
            counts["skipped"] += outcome.dead_lettered
            if progress:
                progress(len(rows))
    finally:
        await consolidator.engine.dispose()
    return counts
