"""What memworker holds in Redis, measured from the server: the readings ``capacity`` assesses.

Everything here is sampled, never a full scan, so it is cheap enough for the lag probe:

- **Memory**: ``INFO memory``: ``used_memory`` as ``maxmemory`` judges it
  (``worker.redis_memory``), ``maxmemory``, ``maxmemory_policy``.
- **Bytes per session and per dedupe record**: ``SCAN`` pages (no ``MATCH``, so the pages are
  a uniform sample of the keyspace: Redis walks its hash table, which is ordered by hash, not
  by name). Each key is classified by ``worker.keys.KeyKinds``; for up to a budget of them,
  ``MEMORY USAGE`` of the session's keys (a session's ``meta`` key names all its keys) or of
  the dedupe record. Counts are estimated as ``DBSIZE × share of the scanned keys``, exact once
  a whole SCAN cycle has been seen.
- **Bytes per stream entry**: ``MEMORY USAGE`` of each stream ÷ its length.
- **Rate**: commands per second from the lifecycle streams' ``entries-added`` (``XINFO
  STREAM``), read twice some seconds apart (the CLI) or at each probe (the metrics); with no
  second reading, the average over what the stream retains (its length ÷ the time between its
  first and last entry).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from worker import redis_memory
from worker.codec import text
from worker.keys import (
    DEDUPE_KIND,
    FINISHED_STATE,
    SEQ_KIND,
    SESSION_KIND,
    STATE_FIELD,
    KeyKinds,
    StreamKeys,
    changes_dlq,
    episodes_dlq,
    episodes_stream,
)
from worker.settings import Settings

MAX_MEASURED = 500
"""Keys of one kind measured (MEMORY USAGE) in one sample at most."""


@dataclass(frozen=True, slots=True)
class StreamUsage:
    stream: str
    length: int
    bytes: int
    entries_added: int
    first_ms: int | None
    last_ms: int | None

    @property
    def bytes_per_entry(self) -> float | None:
        return self.bytes / self.length if self.length else None


@dataclass(slots=True)
class KindSample:
    """Keys of one kind seen by the sampler: how many were seen, and bytes of those measured."""

    seen: int = 0
    measured: int = 0
    bytes: int = 0

    @property
    def bytes_each(self) -> float | None:
        return self.bytes / self.measured if self.measured else None


@dataclass(slots=True)
class KeySample:
    """What SCAN pages showed: keys seen in total and per kind (live, finished, dedupe)."""

    scanned: int = 0
    complete: bool = False
    kinds: dict[str, KindSample] = field(
        default_factory=lambda: {
            k: KindSample() for k in ("live", "finished", DEDUPE_KIND, SEQ_KIND)
        }
    )

    def estimate(self, kind: str, dbsize: int) -> float:
        """How many keys of ``kind`` Redis holds: exact after a whole SCAN cycle."""
        seen = self.kinds[kind].seen
        if self.complete or not self.scanned:
            return float(seen)
        return dbsize * seen / self.scanned


async def sample_keys(
    redis: Redis,
    settings: Settings,
    *,
    cursor: int = 0,
    max_keys: int = 2_000,
    max_measured: int = 50,
    sample: KeySample | None = None,
) -> tuple[KeySample, int]:
    """SCAN from ``cursor`` until ``max_keys`` keys were seen or the cycle ends; measure up to
    ``max_measured`` more keys of each kind (sessions: all their keys), at most
    ``MAX_MEASURED`` per kind in a sample. Returns the sample and the cursor to continue from
    (0: the cycle is complete)."""
    kinds = KeyKinds(settings.stream_prefix)
    sample = sample or KeySample()
    limits = {
        kind: min(MAX_MEASURED, found.measured + max_measured)
        for kind, found in sample.kinds.items()
    }
    seen_here = 0
    while True:
        cursor, names = await redis.scan(cursor=cursor, count=min(1_000, max_keys))
        sample.scanned += len(names)
        seen_here += len(names)
        sessions: list[str] = []
        records: dict[str, list[str]] = {DEDUPE_KIND: [], SEQ_KIND: []}
        for raw in names:
            name = text(raw)
            kind = kinds.kind_of(name)
            if kind == SESSION_KIND:
                sessions.append(name)
            elif kind is not None:
                records[kind].append(name)
        await _measure_sessions(redis, kinds, sessions, sample, limits)
        for kind, found in records.items():
            await _measure_records(redis, found, sample.kinds[kind], limits[kind])
        if cursor == 0:
            sample.complete = True
            return sample, 0
        if seen_here >= max_keys:
            return sample, int(cursor)


async def _measure_records(redis: Redis, names: list[str], kind: KindSample, limit: int) -> None:
    """Count one-key records (dedupe, seq); MEMORY USAGE until ``limit`` are measured."""
    kind.seen += len(names)
    room = max(0, limit - kind.measured)
    if not names[:room]:
        return
    pipe = redis.pipeline(transaction=False)
    for name in names[:room]:
        pipe.memory_usage(name)
    for used in await pipe.execute():
        if used is not None:
            kind.measured += 1
            kind.bytes += int(used)


async def _measure_sessions(
    redis: Redis, kinds: KeyKinds, metas: list[str], sample: KeySample, limits: dict[str, int]
) -> None:
    """Count sessions by state; measure (MEMORY USAGE of every key) up to the budget."""
    if not metas:
        return
    pipe = redis.pipeline(transaction=False)
    for name in metas:
        pipe.hget(name, STATE_FIELD)
    states = await pipe.execute()
    to_measure: list[tuple[str, list[str]]] = []
    planned = {kind: sample.kinds[kind].measured for kind in ("live", "finished")}
    for name, state in zip(metas, states, strict=True):
        if state is None:
            continue  # expired between SCAN and HGET
        kind = "finished" if text(state) == FINISHED_STATE else "live"
        sample.kinds[kind].seen += 1
        session = kinds.session_of(name)
        if session is not None and planned[kind] < limits[kind]:
            planned[kind] += 1
            to_measure.append((kind, session.all()))
    if not to_measure:
        return
    pipe = redis.pipeline(transaction=False)
    for _kind, keys in to_measure:
        for key in keys:
            pipe.memory_usage(key)
    used = iter(await pipe.execute())
    for kind, keys in to_measure:
        total = sum(int(u) for u in (next(used) for _ in keys) if u is not None)
        sample.kinds[kind].measured += 1
        sample.kinds[kind].bytes += total


def lifecycle_streams(settings: Settings) -> list[str]:
    return [StreamKeys(settings.stream_prefix, s).lifecycle for s in range(settings.shards)]


def memworker_streams(settings: Settings) -> list[str]:
    names: list[str] = []
    for shard in range(settings.shards):
        keys = StreamKeys(settings.stream_prefix, shard)
        names += [keys.lifecycle, keys.results, keys.dlq]
    names.append(episodes_stream(settings.stream_prefix))
    names += [episodes_dlq(settings.stream_prefix), changes_dlq(settings.stream_prefix)]
    return names


def dead_letter_streams(settings: Settings) -> set[str]:
    """Every DLQ: each shard's, the indexer's and the change feed's."""
    names = {StreamKeys(settings.stream_prefix, s).dlq for s in range(settings.shards)}
    return names | {episodes_dlq(settings.stream_prefix), changes_dlq(settings.stream_prefix)}


async def stream_usage(redis: Redis, streams: Iterable[str]) -> list[StreamUsage]:
    """Length, bytes (MEMORY USAGE), entries ever added and first/last entry time of each."""
    names = list(streams)
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.xinfo_stream(name)
        pipe.memory_usage(name)
    replies = await pipe.execute(raise_on_error=False)
    usage = []
    for i, name in enumerate(names):
        info, used = replies[2 * i], replies[2 * i + 1]
        if isinstance(info, Exception) or not isinstance(info, dict):
            usage.append(StreamUsage(name, 0, 0, 0, None, None))
            continue
        first, last = info.get("first-entry"), info.get("last-entry")
        added = info.get("entries-added")
        usage.append(
            StreamUsage(
                name,
                int(info["length"]),
                0 if isinstance(used, Exception) or used is None else int(used),
                int(added if added is not None else info["length"]),
                _entry_ms(first[0]) if first else None,
                _entry_ms(last[0]) if last else None,
            )
        )
    return usage


def _entry_ms(entry_id: bytes | str) -> int:
    return int(text(entry_id).split("-", 1)[0])


async def read_memory(redis: Redis) -> tuple[int, int, str]:
    """Used memory (as ``maxmemory`` judges it), ``maxmemory`` (0: none) and the eviction
    policy, from ``INFO memory``."""
    info: Any = await redis.info("memory")
    return (
        redis_memory.used_memory(info),
        redis_memory.maxmemory(info),
        str(info.get("maxmemory_policy", "")),
    )


class RateMeter:
    """Commands per second from successive readings of the lifecycle streams' entries-added,
    over the last ``window_s`` seconds of readings."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._readings: list[tuple[float, int]] = []

    def add(self, entries_added: int, at: float | None = None) -> None:
        now = time.monotonic() if at is None else at
        self._readings.append((now, entries_added))
        while len(self._readings) > 2 and now - self._readings[1][0] >= self.window_s:
            self._readings.pop(0)

    def rate(self) -> float | None:
        if len(self._readings) < 2:
            return None
        (t0, n0), (t1, n1) = self._readings[0], self._readings[-1]
        if t1 <= t0:
            return None
        return max(0, n1 - n0) / (t1 - t0)


def retained_rate(lifecycle: Iterable[StreamUsage]) -> float | None:
    """Commands per second averaged over what the lifecycle streams still hold."""
    entries, spans = 0, 0.0
    for s in lifecycle:
        if s.length > 1 and s.first_ms is not None and s.last_ms is not None:
            entries += s.length - 1
            spans = max(spans, (s.last_ms - s.first_ms) / 1000)
    if not entries or spans <= 0:
        return None
    return entries / spans


async def recent_commands_per_session(
    redis: Redis | RedisCluster, settings: Settings, windows: int = 10, per_window: int = 50
) -> float | None:
    """Commands ÷ spawns among lifecycle entries read in ``windows`` runs of ``per_window``
    spread evenly over what each stream retains (None: no spawn among them): what one session
    costs in commands, whatever the key layout."""
    entries: dict[tuple[str, bytes], bool] = {}
    for stream in lifecycle_streams(settings):
        first: Any = await redis.xrange(stream, count=1)
        last: Any = await redis.xrevrange(stream, count=1)
        if not first or not last:
            continue
        low, high = _entry_ms(first[0][0]), _entry_ms(last[0][0])
        step = (high - low) / windows
        for w in range(windows):
            rows: Any = await redis.xrange(stream, min=f"{int(low + w * step)}-0", count=per_window)
            for entry_id, fields in rows:
                entries[(stream, entry_id)] = _is_spawn(fields)
    spawns = sum(entries.values())
    return len(entries) / spawns if spawns else None


def _is_spawn(fields: dict[bytes, bytes]) -> bool:
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
        return bool(orjson.loads(fields.get(b"data", b"{}")).get("type") == "spawn")
    return False


async def lifecycle_entries_added(redis: Redis, settings: Settings) -> int:
    """Commands ever added to the lifecycle streams (the rate meter's counter)."""
    usage = await stream_usage(redis, lifecycle_streams(settings))
    return sum(s.entries_added for s in usage)
