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
  published later by the relay (``relay``, run by the group loop's ``tick``): oldest first,
  a bounded batch at a time, at start, every ``relay_retry_s`` while something is owed and
  every ``relay_sweep_interval_s`` anyway (another consolidator's crash). A replay of an
  announced episode publishes nothing. (At least once, exactly once without a crash; the
  event's ``event_id`` is deterministic, so subscribers can drop a duplicate.)
- **Postgres down is not a poison entry.** When a write fails, ``SELECT 1`` tells the two
  apart. Down: nothing is acknowledged and the loop backs off (capped) until it answers. Up: the
  batch is split in halves until the failing entry stands alone; it is retried with backoff and
  dead-lettered (``storage_failed``) after ``consolidation_max_attempts`` failures.
- **The group loop is ``worker.consumers.loop``**: own pending entries first, reclaim of dead
  consumers' entries, the delivery cap and DLQ, outages, readiness. This module is its handler:
  it turns entries into rows (``prepare``) and writes them (``finish``).
- **Both cores busy** (bench/consolidation_throughput.py). While a batch is written, the next
  is read and turned into rows; a batch is written as two transactions at once (split by
  session), since a Postgres backend uses one core and inserting is most of the work. Rows
  are tuples sent as one array per column (``worker.db.batch``), and a result is checked by
  a cheap structural test of its JSON types, the pydantic model deciding only what that test
  cannot vouch for: validation cost more than the INSERT.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, get_args

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.commands import Outcome
from schemas.results import RESULT_ADAPTER, AgentTerminated, RejectionReason, Result
from schemas.streams import EpisodeRecorded
from worker.connections import client_for
from worker.consumers.loop import (
    BatchOutcome,
    Failure,
    GroupConsumer,
    Rejection,
    StorageUnavailableError,
    StreamEntry,
)
from worker.db.batch import insert_batch, mark_announced, owed_announcements
from worker.db.engine import create_database_engine
from worker.db.models import EPISODE_NAMESPACE, episode_id_for
from worker.episodes.summary import build_context_summary, summarise
from worker.ids import uuid5_text
from worker.keys import CONSOLIDATION_GROUP, StreamKeys, episodes_stream
from worker.logs import get_logger
from worker.metrics import (
    CONSOLIDATION_SECONDS,
    EPISODES_RECORDED,
    RESULTS_STORED,
)
from worker.settings import Settings

log = get_logger("worker.consolidation.consolidator")

FASTSTREAM_DATA_FIELD = "__data__"
PREPARE_SLICE = 50
"""Entries prepared between two turns of the event loop (see ``Consolidator.prepare``)."""
MIN_PART = 50
"""A batch is written in parts (``Consolidator.writers``) only when each can have this many."""


class UnusableEntryError(ValueError):
    """A stream entry that can never become a row: its DLQ ``reason`` says why."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason = reason


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
        return EpisodeRecorded.model_validate_json(self.wire())

    def wire(self) -> bytes:
        """The event as JSON, built without the model: one per episode, on the hot path."""
        episode_id = str(self.episode_id)
        return orjson.dumps(
            {
                "type": "episode.recorded",
                "event_id": uuid5_text(EPISODE_NAMESPACE, f"episode.recorded:{episode_id}"),
                "episode_id": episode_id,
                "project_id": self.project_id,
                "session_id": self.session_id,
                "causation_id": self.source_event_id,
            }
        )


def _aware(value: datetime | None) -> datetime | None:
    return None if value is None else _utc(value)


def _utc(value: datetime) -> datetime:
    """A timestamp without an offset is UTC's."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


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


# -- the hot path: a cheap check, rows as tuples -------------------------------------------------
#
# Validating a result with pydantic cost more than writing it. Nearly every result is a
# well-formed JSON object from the lifecycle worker, so a structural check of exact JSON types
# stands in for the model: it accepts only what the model accepts (and reads it the same way),
# and anything else (a coercible value, an unusual timestamp, an error) goes to the model,
# which accepts it or explains precisely why not for the DLQ.

Check = Callable[[Any], bool]

_INSTANT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?(?:Z|[+-][0-9]{2}:[0-9]{2})"
)


def _instant(value: Any) -> datetime | None:
    """An RFC 3339 timestamp with an offset (as Python and pydantic both read it), else None."""
    if type(value) is str and _INSTANT.fullmatch(value):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(value)
    return None


def _is_str(value: Any) -> bool:
    return type(value) is str


def _is_str_or_none(value: Any) -> bool:
    return value is None or type(value) is str


def _is_int_or_none(value: Any) -> bool:
    return value is None or type(value) is int


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_duration(value: Any) -> bool:
    return (type(value) is float or type(value) is int) and value >= 0


def _is_number_or_none(value: Any) -> bool:
    return value is None or type(value) is float or type(value) is int


def _is_fraction(value: Any) -> bool:
    return (type(value) is float or type(value) is int) and 0 <= value <= 1


def _is_bool(value: Any) -> bool:
    return type(value) is bool


def _is_object_or_none(value: Any) -> bool:
    return value is None or type(value) is dict


_STR_ONLY = frozenset({str})
_OBJECTS_ONLY = frozenset({dict})


def _is_str_list(value: Any) -> bool:
    return type(value) is list and _STR_ONLY.issuperset(map(type, value))


def _one_of(*allowed: str) -> Check:
    values = frozenset(allowed)
    return lambda value: type(value) is str and value in values


def _is_snapshot_or_none(value: Any) -> bool:
    """``SnapshotShape``, checked the same way."""
    if value is None:
        return True
    if type(value) is not dict:
        return False
    scratchpad, checkpoints = value.get("scratchpad"), value.get("checkpoints")
    return (
        type(value.get("variables")) is dict
        and _is_object_or_none(value.get("task_state"))
        and type(scratchpad) is list
        and _OBJECTS_ONLY.issuperset(map(type, scratchpad))
        and _is_str_list(checkpoints)
    )


_COMMON_FIELDS: tuple[tuple[str, Check, bool], ...] = (  # name, check, required
    ("event_id", _is_str, True),
    ("causation_id", _is_str, True),
    ("command", _is_str_or_none, True),
    ("duration_ms", _is_duration, True),
    ("project_id", _is_str_or_none, False),
    ("session_id", _is_str_or_none, False),
    ("agent_instance_id", _is_str_or_none, False),
    ("agent_type_id", _is_str_or_none, False),
    ("seq", _is_int_or_none, False),
    ("correlation_id", _is_str_or_none, False),
    ("metadata", _is_object_or_none, False),
)
_TIMESTAMP_FIELDS = frozenset({"occurred_at", "started_at"})  # checked apart: parsed too
_FIELDS_OF: dict[str, tuple[tuple[str, Check, bool], ...]] = {
    "agent.spawned": (*_COMMON_FIELDS, ("initial_items", _is_count, True)),
    "agent.paused": (
        *_COMMON_FIELDS,
        ("checkpoint_id", _is_str, True),
        ("items_saved", _is_count, True),
    ),
    "agent.resumed": (
        *_COMMON_FIELDS,
        ("checkpoint_id", _is_str, True),
        ("items_restored", _is_count, True),
    ),
    "agent.terminated": (
        *_COMMON_FIELDS,
        ("outcome", _one_of(*get_args(Outcome)), True),
        ("items_cleared", _is_count, True),
        ("consolidate", _is_bool, True),
        ("task_description", _is_str_or_none, False),
        ("lessons_learned", _is_str_list, True),
        ("tokens_used", _is_int_or_none, False),
        ("importance", _is_fraction, True),
        ("duration_seconds", _is_number_or_none, False),
        ("snapshot", _is_snapshot_or_none, False),
    ),
    "command.rejected": (
        *_COMMON_FIELDS,
        ("reason", _one_of(*get_args(RejectionReason)), True),
        ("detail", _is_str, True),
    ),
}


def _fields_match_the_models() -> None:
    """The cheap check must know every field of every result model: a field added to a model
    and not here would go unchecked."""
    for member in get_args(get_args(Result)[0]):
        kind = member.model_fields["type"].default
        known = {name for name, _check, _required in _FIELDS_OF[kind]} | {"type"}
        known |= _TIMESTAMP_FIELDS & set(member.model_fields)
        if known != set(member.model_fields):
            raise RuntimeError(f"the cheap check of {kind} is out of date with its model")


_fields_match_the_models()


def check_result(payload: Mapping[str, Any]) -> tuple[datetime, datetime | None] | None:
    """``(occurred_at, started_at)`` when ``payload`` (JSON-decoded) is certainly a valid result,
    read exactly as ``parse_result`` would read it; None when the model must decide."""
    kind = payload.get("type")
    fields = _FIELDS_OF.get(kind) if type(kind) is str else None
    if fields is None:
        return None
    for name, check, required in fields:
        if name in payload:
            if not check(payload[name]):
                return None
        elif required:
            return None
    occurred_at = _instant(payload.get("occurred_at"))
    if occurred_at is None:
        return None
    started_at = None
    if kind == "agent.terminated":
        if (raw := payload.get("started_at")) is not None and (started_at := _instant(raw)) is None:
            return None
        if payload["consolidate"] and not (payload.get("project_id") and payload.get("session_id")):
            return None  # parse_result words the error
    return occurred_at, started_at


_VALUE_FIELDS = (
    "event_id",
    "type",
    "project_id",
    "session_id",
    "agent_instance_id",
    "agent_type_id",
    "causation_id",
    "command",
    "seq",
    "consolidate",
    "task_description",
    "outcome",
    "lessons_learned",
    "tokens_used",
    "importance",
    "duration_seconds",
)


@dataclass(frozen=True, slots=True)
class PreparedResult:
    """One result as rows: ``EVENT_COLUMNS`` and (when consolidated) ``EPISODE_COLUMNS`` values."""

    entry: StreamEntry
    event: tuple[Any, ...]
    episode: tuple[Any, ...] | None

    @property
    def event_id(self) -> str:
        return str(self.event[0])


def prepare_result(entry: StreamEntry, summary_max_chars: int) -> PreparedResult:
    """The rows of one entry; raises ``UnusableEntryError`` for an entry that has none."""
    payload = decode_entry(entry.fields)
    checked = check_result(payload)
    values: Mapping[str, Any]
    if checked is not None:
        occurred_at, started_at = checked
        values = payload
    else:
        result = parse_result(payload)
        values = {name: getattr(result, name, None) for name in _VALUE_FIELDS}
        occurred_at = _utc(result.occurred_at)
        started_at = _aware(result.started_at) if isinstance(result, AgentTerminated) else None
    get = values.get
    event_id, project_id, session_id = values["event_id"], get("project_id"), get("session_id")
    event = (
        event_id,
        values["type"],
        project_id,
        session_id,
        get("agent_instance_id"),
        values["causation_id"],
        values["command"],
        get("seq"),
        occurred_at,
        orjson.dumps(event_payload(payload)).decode(),
    )
    if values["type"] != "agent.terminated" or not values["consolidate"]:
        return PreparedResult(entry, event, None)
    snapshot = payload.get("snapshot")
    lessons = values["lessons_learned"]
    duration = get("duration_seconds")
    episode = (
        uuid5_text(EPISODE_NAMESPACE, event_id),  # episode_id_for, as text
        event_id,
        project_id,
        session_id,
        get("agent_instance_id"),
        get("agent_type_id"),
        get("task_description"),
        values["outcome"],
        orjson.dumps(lessons).decode(),
        summarise(get("task_description"), values["outcome"], lessons, snapshot, summary_max_chars),
        None if snapshot is None else orjson.dumps(snapshot).decode(),
        get("tokens_used"),
        float(values["importance"]),
        None if duration is None else float(duration),
        started_at,
        occurred_at,
    )
    return PreparedResult(entry, event, episode)


@dataclass(slots=True)
class PreparedBatch:
    """A batch read and turned into rows, not yet written."""

    results: list[PreparedResult] = field(default_factory=list)
    dead: list[Rejection] = field(default_factory=list)


@dataclass(slots=True)
class ConsolidationOutcome(BatchOutcome):
    episodes_announced: int = 0


def one_line(exc: BaseException) -> str:
    """The first line of what went wrong (a DBAPIError's driver error, without SQL and link)."""
    text_ = str(exc.__cause__ or exc)
    return text_.splitlines()[0] if text_ else repr(exc)


def is_connection_error(exc: BaseException) -> bool:
    """True for failures that say nothing about the data: the server is gone or going."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OSError | ConnectionError | TimeoutError)


class Consolidator:
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
        """``loop_options`` go to ``GroupConsumer``: ``consumer``, ``block_ms``,
        ``reclaim_idle_ms``, ``reclaim_interval_s``, ``backoff_initial_s``, ... .

        The relay (``relay``) publishes up to ``relay_batch`` owed announcements per
        transaction, of episodes recorded at least ``relay_grace_s`` ago (younger ones may be
        in the hands of another consolidator between its COMMIT and its XADD)."""
        self.settings = settings
        self.redis = redis
        self.engine = engine
        self.probe_timeout_s = probe_timeout_s
        self.writers = writers
        shards = [StreamKeys(settings.stream_prefix, i) for i in range(settings.shards)]
        self.streams = [keys.results for keys in shards]
        self._dlq_of = {keys.results: keys.dlq for keys in shards}
        self._episodes_stream = episodes_stream(settings.stream_prefix)
        self._owns_clients = False
        self.relay_batch = relay_batch
        self.relay_grace_s = relay_grace_s
        self.relay_retry_s = relay_retry_s
        self.relay_sweep_interval_s = relay_sweep_interval_s
        self._owed = False
        """An announcement was refused: the relay runs every ``relay_retry_s``, and new
        episodes wait for it (so they go out in order)."""
        self._last_relay = float("-inf")
        self._refused_at = float("-inf")
        self.loop: GroupConsumer[PreparedBatch] = GroupConsumer(
            redis,
            self,
            batch_size=batch_size or settings.consolidation_batch_size,
            max_attempts=settings.consolidation_max_attempts,
            tick=self.relay_tick,
            **loop_options,
        )
        self.consumer = self.loop.consumer
        self.log = log.bind(consumer=self.consumer)

    # -- public --------------------------------------------------------------------------------

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> Consolidator:
        """A consolidator with its own Redis client and engine (closed by ``close``)."""
        consolidator = cls(
            settings,
            client_for(settings),
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
        return self.loop.is_ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Consolidate until ``stop`` is set (``GroupConsumer.run``)."""
        await self.loop.run(stop)

    async def run_once(self) -> int:
        """Consolidate everything available now (``GroupConsumer.run_once``)."""
        return await self.loop.run_once()

    async def ensure_groups(self) -> None:
        await self.loop.ensure_groups()

    async def replay(self, entries: Sequence[StreamEntry]) -> ConsolidationOutcome:
        """Store ``entries`` again (a replay): idempotent; junk is skipped, not dead-lettered,
        and nothing is acknowledged."""
        outcome = ConsolidationOutcome()
        batch = await self.prepare(entries)
        outcome.dead_lettered += len(batch.dead)
        if batch.results:
            await self._store_all(batch.results, outcome)
        outcome.dead_lettered += len(outcome.failed)
        return outcome

    # -- the group handler ---------------------------------------------------------------------

    def dlq_stream(self, stream: str) -> str:
        return self._dlq_of[stream]

    async def check_storage(self) -> None:
        if (error := await self._storage_error()) is not None:
            raise StorageUnavailableError(f"postgres cannot be used: {one_line(error)}") from error

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
                raise StorageUnavailableError(f"postgres cannot be used: {one_line(exc)}") from exc
            if len(parsed) > 1:
                middle = len(parsed) // 2
                await self._store(parsed[:middle], outcome)
                await self._store(parsed[middle:], outcome)
                return
            outcome.failed.append(self._failure(parsed[0], exc))
            return
        outcome.done.extend(p.entry for p in parsed)  # committed: acknowledged, announced or not
        outcome.episodes_announced += await self._announce(announcements)

    @staticmethod
    def _failure(parsed: PreparedResult, exc: Exception) -> Failure:
        error = one_line(exc)
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
        for p in prepared:
            events.setdefault(p.event_id, p.event)
            if p.episode is not None:
                episodes.setdefault(p.event_id, p.episode)
        async with self.engine.begin() as conn:
            owed = await insert_batch(conn, list(events.values()), list(episodes.values()))
        return [Announcement(*key) for key in owed]

    async def _announce(self, announcements: Sequence[Announcement]) -> int:
        """Publish ``episode.recorded`` for episodes just committed, then mark them announced;
        how many were. While the relay owes older ones, it publishes these too, after them."""
        if not announcements or self._owed:
            return 0
        published = await self._publish(announcements)
        if published:
            try:
                async with self.engine.begin() as conn:
                    await mark_announced(conn, [a.episode_id for a in published])
            except Exception as exc:
                raise StorageUnavailableError(f"postgres cannot be used: {one_line(exc)}") from exc
        return len(published)

    async def _publish(self, announcements: Sequence[Announcement]) -> list[Announcement]:
        """XADD each to ``P:episodes`` (one pipeline); the ones Redis accepted. A refusal (a
        full Redis) or an unreachable Redis leaves the rest owed: the relay publishes them."""
        pipe = self.redis.pipeline(transaction=False)
        stream = self._episodes_stream
        for announcement in announcements:
            pipe.execute_command("XADD", stream, "*", "data", announcement.wire())
        try:
            replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            replies = [exc] * len(announcements)
        published = [
            a
            for a, reply in zip(announcements, replies, strict=True)
            if not isinstance(reply, Exception)
        ]
        if len(published) < len(announcements):
            refusal = next(r for r in replies if isinstance(r, Exception))
            if not self._owed:
                self.log.warning(
                    "episode.recorded refused, the relay will publish it",
                    owed=len(announcements) - len(published),
                    error=one_line(refusal),
                )
            self._owed = True
            self._refused_at = asyncio.get_running_loop().time()
        return published

    def _refused_recently(self) -> bool:
        """A refusal less than ``relay_grace_s`` ago: those episodes are still too young for
        the relay to see, so it keeps coming back for them."""
        return asyncio.get_running_loop().time() - self._refused_at < self.relay_grace_s

    async def relay_tick(self) -> None:
        """The group loop's ``tick``: ``relay`` when due; never raises but for cancellation."""
        now = asyncio.get_running_loop().time()
        interval = self.relay_retry_s if self._owed else self.relay_sweep_interval_s
        if now - self._last_relay < interval:
            return
        self._last_relay = now
        try:
            await self.relay()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Postgres unavailable: the loop meets it too; retry later
            self._owed = True
            self.log.warning("announcement relay failed, will retry", error=one_line(exc))

    async def relay(self, max_batches: int = 10) -> int:
        """Publish episodes still owed an ``episode.recorded`` (``announced_at IS NULL``),
        oldest first, up to ``max_batches`` × ``relay_batch``; how many were published. Each
        batch is one transaction: rows locked (``SKIP LOCKED``: two relays never take the
        same), XADD, marked; a refusal ends the run and leaves the rest owed."""
        total = 0
        owed = True
        for _ in range(max_batches):
            async with self.engine.begin() as conn:
                keys = await owed_announcements(conn, self.relay_grace_s, self.relay_batch)
                if not keys:
                    owed = self._refused_recently()
                    break
                wanted = [Announcement(*key) for key in keys]
                published = await self._publish(wanted)
                if published:
                    await mark_announced(conn, [a.episode_id for a in published])
            total += len(published)
            if len(published) < len(wanted):
                break
            if len(keys) < self.relay_batch:
                owed = self._refused_recently()
                break
        self._owed = owed
        if total:
            EPISODES_RECORDED.inc(total)
            self.log.info("owed announcements published", count=total, still_owed=owed)
        return total

    async def _storage_error(self) -> Exception | None:
        """None when Postgres answers ``SELECT 1``, else why not."""
        try:
            async with asyncio.timeout(self.probe_timeout_s), self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:
            return exc
        return None


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
    never announced); ``skipped`` entries were not results. (``worker.consolidation.replay`` has
    the rest: time ranges, one project, Postgres as the source, republishing.)
    """
    from worker.consolidation.replay import ResultRange, replay_results_from_stream

    return await replay_results_from_stream(
        redis, settings, shard, ResultRange(start, end), progress=progress
    )
