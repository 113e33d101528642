"""Replay of results, from the results stream or, older than its retention, from Postgres.

Replaying a result does the same three things whichever source it is read from:

1. **Stores it**: its ``lifecycle_events`` row and (``agent.terminated`` with ``consolidate``)
   its episode, when they are missing: after a Postgres restore, the stream rebuilds what the
   backup lacks. Read from Postgres, a result is there by definition, so this step finds
   nothing to do.
2. **Announces owed episodes**: an episode whose ``episode.recorded`` was never published (a
   crash between COMMIT and XADD) is announced and marked, exactly as the consolidator does.
3. With ``publish_to``, **republishes it** on a stream the operator names, as a ``data`` field
   holding the result as the worker published it (snapshot included: Postgres keeps it in
   ``episodes.snapshot`` and it is put back), for subscribers that missed it (a subscriber
   reading with plain XREAD, a new one backfilling, one that lost what it had processed).

Both sources go through ``Consolidator.replay``, so what they store and announce is the same
code. Steps 1 and 2 are idempotent: replaying twice changes nothing. Step 3 is a delivery:
each run publishes again, with the same deterministic result ``event_id`` s, which is how a
subscriber drops what it has already seen (it must do so for any redelivery).

Postgres holds what the consolidator has stored: a result it has not reached yet is only in
the stream. A session id used again after its tombstone expired has one episode per life
(``episodes.life``, migration 0009), so each life's ``agent.terminated`` comes back from
Postgres with its own snapshot.

A range in Postgres is a time range over the result's ``occurred_at`` (the stream ids are not
kept there); in the stream it is an id range, and a time range is turned into ids (an id's
first part is the millisecond the entry was added). Postgres is read in one pass, ordered by
``(occurred_at, event_id)``: ``lifecycle_events`` has no index on ``occurred_at`` alone, so
the read is one sequential scan of the table (plus one for the count of the progress bar).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy import Select, and_, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.inputs import parse_when
from worker.codec import UnusableEntryError, decode_entry, text
from worker.consolidation.consolidator import Consolidator
from worker.consumers.loop import StreamEntry
from worker.db.engine import create_database_engine
from worker.db.erasures import covered, written_at
from worker.db.models import Episode, LifecycleEvent
from worker.keys import StreamKeys, shard_of
from worker.settings import Settings

Progress = Callable[[int], None]
ARCHIVED_ENTRY_ID = "0-0"
"""The stream id given to a result read from Postgres (it has none any more); a replay
acknowledges nothing."""

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_instant(raw: str, now: datetime | None = None) -> datetime:
    """An RFC 3339 time (``2026-11-20T08:00:00Z``, the input rule's ``parse_when``) or how
    long ago (``90m``, ``36h``, ``7d``); ``ValueError`` saying why not."""
    match = _RELATIVE.match(raw.strip())
    if match:
        seconds = float(match[1]) * _UNITS[match[2]]
        try:
            return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
        except OverflowError:  # longer ago than the calendar goes
            raise ValueError(f"{raw!r} is before 0001-01-01") from None
    try:
        value = parse_when(raw.strip())
    except ValueError as exc:
        raise ValueError(f"{exc}; or a time ago (90m, 36h, 7d)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def id_at(instant: datetime, last: bool = False) -> str:
    """The first (or last) possible stream id of the millisecond ``instant``."""
    ms = int(instant.timestamp() * 1000)
    return f"{ms}-18446744073709551615" if last else f"{ms}-0"


@dataclass(frozen=True, slots=True)
class ResultRange:
    """What to replay: a stream id range or a time range, optionally one project."""

    start: str = "-"
    end: str = "+"
    since: datetime | None = None
    until: datetime | None = None
    project: str | None = None

    def stream_bounds(self) -> tuple[str, str]:
        """The id range in the stream: the later of ``start``/``since``, the earlier of
        ``end``/``until``."""
        start, end = self.start, self.end
        if self.since is not None:
            start = _later(start, id_at(self.since))
        if self.until is not None:
            end = _earlier(end, id_at(self.until, last=True))
        return start, end


STREAM_ID = re.compile(r"^\d+(-\d+)?$")
"""A stream id a range may start or end at (besides ``-`` and ``+``)."""


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _later(a: str, b: str) -> str:
    if a == "-":
        return b
    return a if _id_key(a) >= _id_key(b) else b


def _earlier(a: str, b: str) -> str:
    if a == "+":
        return b
    return a if _id_key(a) <= _id_key(b) else b


def _project_of(fields: dict[str, Any]) -> str | None:
    try:
        project = decode_entry(fields).get("project_id")
    except UnusableEntryError:
        return None
    return project if isinstance(project, str) else None


class ResultReplayer:
    """Stores, announces and (optionally) republishes batches of results (see module doc)."""

    def __init__(
        self, redis: Redis, settings: Settings, engine: AsyncEngine, publish_to: str | None
    ) -> None:
        self.redis = redis
        self.settings = settings
        self.engine = engine
        self.publish_to = publish_to
        self.consolidator = Consolidator(settings, redis, engine, consumer="replay")
        self.counts: Counter[str] = Counter()

    async def replay(self, entries: list[StreamEntry]) -> None:
        entries = await self._not_forgotten(entries)
        if not entries:
            return
        outcome = await self.consolidator.replay(entries)
        self.counts["results"] += len(outcome.done)
        self.counts["new_episodes"] += outcome.episodes_announced
        self.counts["skipped"] += outcome.dead_lettered
        if self.publish_to is not None:
            results = [e for e in entries if _is_result(e)]
            pipe = self.redis.pipeline(transaction=False)
            for entry in results:
                fields = {k: v for k, v in entry.fields.items() if k in ("data", "traceparent")}
                pipe.xadd(self.publish_to, fields)
            await pipe.execute()
            self.counts["published"] += len(results)

    async def _not_forgotten(self, entries: list[StreamEntry]) -> list[StreamEntry]:
        """``entries`` less those an erasure covers (``worker.db.erasures``): neither stored
        nor republished; counted ``forgotten``."""
        scopes = [_scope_of(e) for e in entries]
        wanted = [i for i, scope in enumerate(scopes) if scope is not None]
        if not wanted:
            return entries
        async with self.engine.connect() as conn:
            gone = await covered(conn, [s for s in scopes if s is not None])
        dropped = {i for i, g in zip(wanted, gone, strict=True) if g}
        if dropped:
            self.counts["forgotten"] += len(dropped)
        return [e for i, e in enumerate(entries) if i not in dropped]


def _scope_of(
    entry: StreamEntry,
) -> tuple[str | None, str | None, datetime, str | None, datetime] | None:
    """``(project, session, occurred_at, user, written_at)`` of a result (None for junk: skipped as
    before)."""
    try:
        result = decode_entry(entry.fields)
        occurred = datetime.fromisoformat(str(result["occurred_at"]))
    except (UnusableEntryError, KeyError, ValueError):
        return None
    project, session = result.get("project_id"), result.get("session_id")
    user = result.get("user_id")
    at = occurred if occurred.tzinfo else occurred.replace(tzinfo=UTC)
    return (
        project if isinstance(project, str) else None,
        session if isinstance(session, str) else None,
        at,
        user if isinstance(user, str) else None,
        written_at(entry.entry_id, at),
    )


def _is_result(entry: StreamEntry) -> bool:
    """An entry worth republishing: a JSON object in ``data`` (junk is skipped, as stored)."""
    try:
        return "event_id" in decode_entry(entry.fields)
    except UnusableEntryError:
        return False


async def replay_results_from_stream(
    redis: Redis,
    settings: Settings,
    shard: int,
    what: ResultRange,
    publish_to: str | None = None,
    progress: Progress | None = None,
) -> Counter[str]:
    """Replay ``P:results:{shard}`` entries in ``what``; counts of what changed."""
    from worker.lifecycle.replay import read_range

    stream = StreamKeys(settings.stream_prefix, shard).results
    start, end = what.stream_bounds()
    engine = create_database_engine(settings.database_url)
    replayer = ResultReplayer(redis, settings, engine, publish_to)
    try:
        async for rows in read_range(redis, stream, start, end, settings.consolidation_batch_size):
            entries = [
                StreamEntry(stream, text(i), {text(k): v for k, v in f.items()}) for i, f in rows
            ]
            if what.project is not None:
                entries = [e for e in entries if _project_of(e.fields) == what.project]
            await replayer.replay(entries)
            if progress:
                progress(len(rows))
    finally:
        await engine.dispose()
    return replayer.counts


def _archived(what: ResultRange, columns: Any) -> Select[Any]:
    conditions = []
    if what.since is not None:
        conditions.append(LifecycleEvent.occurred_at >= what.since)
    if what.until is not None:
        conditions.append(LifecycleEvent.occurred_at <= what.until)
    if what.project is not None:
        conditions.append(LifecycleEvent.project_id == what.project)
    return select(*columns).where(and_(True, *conditions))


async def count_archived(engine: AsyncEngine, what: ResultRange) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(_archived(what, [func.count()]))).scalar_one())


async def read_archived(
    engine: AsyncEngine, what: ResultRange, batch: int
) -> AsyncIterator[list[dict[str, Any]]]:
    """Batches of results in ``what`` as the worker published them (``payload`` with its
    ``snapshot`` put back), ordered by ``(occurred_at, event_id)``; one pass, one cursor."""
    query = (
        _archived(what, [LifecycleEvent.payload, Episode.snapshot])
        .outerjoin(Episode, Episode.source_event_id == LifecycleEvent.event_id)
        .order_by(LifecycleEvent.occurred_at, LifecycleEvent.event_id)
        .execution_options(yield_per=batch)
    )
    async with engine.connect() as conn:
        rows = await conn.stream(query)
        async for part in rows.partitions(batch):
            results = []
            for payload, snapshot in part:
                result = dict(payload)
                if snapshot is not None:
                    result["snapshot"] = snapshot
                results.append(result)
            yield results


async def replay_results_from_postgres(
    redis: Redis,
    settings: Settings,
    shards: list[int],
    what: ResultRange,
    publish_to: str | None = None,
    progress: Progress | None = None,
    engine: AsyncEngine | None = None,
) -> Counter[str]:
    """Replay the results of ``what`` kept in ``lifecycle_events`` (of the sessions of
    ``shards``); counts of what changed, as from the stream."""
    own = engine is None
    engine = engine or create_database_engine(settings.database_url)
    replayer = ResultReplayer(redis, settings, engine, publish_to)
    wanted = set(shards)
    try:
        async for results in read_archived(engine, what, settings.consolidation_batch_size):
            entries = []
            for result in results:
                shard = _shard_of(result, settings.shards)
                if shard in wanted:
                    stream = StreamKeys(settings.stream_prefix, shard).results
                    fields = {"data": orjson.dumps(result)}
                    entries.append(StreamEntry(stream, ARCHIVED_ENTRY_ID, dict(fields)))
            await replayer.replay(entries)
            if progress:
                progress(len(results))
    finally:
        if own:
            await engine.dispose()
    return replayer.counts


def _shard_of(result: dict[str, Any], shards: int) -> int:
    project, session = result.get("project_id"), result.get("session_id")
    if isinstance(project, str) and isinstance(session, str):
        return shard_of(project, session, shards)
    return 0


def starts_before(start: str, first_ms: int) -> bool:
    """True when a range starting at id ``start`` begins before the millisecond ``first_ms``."""
    return start == "-" or _id_key(start) < (first_ms, 0)
