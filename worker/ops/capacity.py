"""Capacity: how long until Redis is full, from what ``capacity_sampling`` measured.

What one command leaves, and for how long (the capacity-planning formula of the README):
one lifecycle entry and one results entry and its share of an ``episode.recorded`` in
``P:episodes`` (episodes ÷ commands added; all held ``retention_seconds``), a dedupe record when
it is a key of its own (``dedupe_ttl_seconds``; a session's records are in its own keys) and
its share of a finished session's tombstone and seq counter (their bytes ÷ commands per
session, held the longer of ``tombstone_ttl_seconds`` and ``dedupe_ttl_seconds``). At ``r``
commands/s the windows hold
``r × Σ bytes × seconds``; Redis levels off at ``used − (what the windows hold now) + that``.

Besides the report of ``memworker stats`` (``measure_capacity``, ``render_capacity``), the lag
probe refreshes the capacity gauges of ``worker.metrics`` (``CapacityGauges``) at a bounded
cost per refresh (``CapacityProbe``).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError

from worker.keys import DEDUPE_KIND, SEQ_KIND, StreamKeys, episodes_stream
from worker.logs import get_logger
from worker.ops.capacity_sampling import (
    KeySample,
    RateMeter,
    StreamUsage,
    dead_letter_streams,
    lifecycle_entries_added,
    lifecycle_streams,
    memworker_streams,
    read_memory,
    recent_commands_per_session,
    retained_rate,
    sample_keys,
    stream_usage,
)
from worker.settings import Settings

log = get_logger("worker.ops.capacity")

GB = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Capacity:
    """The capacity report of ``memworker stats`` and of the capacity gauges."""

    used_memory: int
    maxmemory: int
    maxmemory_policy: str
    keys: int
    keys_scanned: int
    scan_complete: bool
    live_sessions: float
    finished_sessions: float
    dedupe_records: float
    bytes_per_live_session: float | None
    bytes_per_finished_session: float | None
    """Its tombstone (its dedupe records are packed in it) and its seq counter (when its
    commands were published with ``LifecycleClient``), while they are kept."""
    bytes_per_tombstone: float | None
    """What is left of the session's own keys after terminate."""
    commands_per_session: float | None
    """Commands ÷ spawns in the lifecycle streams (see ``recent_commands_per_session``)."""
    bytes_per_dedupe_record: float | None
    bytes_per_lifecycle_entry: float | None
    bytes_per_result_entry: float | None
    commands_per_second: float | None
    rate_source: str
    bytes_per_command: float | None
    byte_seconds_per_command: float | None
    window_bytes_now: float
    steady_state_used_memory: float | None
    seconds_until_full: float | None
    verdict: str
    streams: list[StreamUsage]
    bytes_per_episodes_entry: float | None = None
    """An ``episode.recorded`` in ``P:episodes`` (one per session life that ends with a
    consolidated terminate), held ``retention_seconds`` like the other streams' entries."""
    episodes_per_command: float | None = None
    """Entries ever added to ``P:episodes`` ÷ entries ever added to the lifecycle streams
    (``XINFO STREAM`` entries-added): a command's share of an episode announcement."""
    dead_letter_entries: int = 0
    """Dead letters in every DLQ (each shard's and the indexer's), kept at most
    ``dlq_max_entries`` each and ``dlq_retention_seconds``: not a command's share."""
    dead_letter_bytes: int = 0

    @property
    def commands_per_second_per_gb(self) -> float | None:
        """Sustained commands/s one GB holds at these sizes and windows."""
        if not self.byte_seconds_per_command:
            return None
        return GB / self.byte_seconds_per_command

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["streams"] = [
            {**asdict(s), "bytes_per_entry": s.bytes_per_entry} for s in self.streams
        ]
        data["commands_per_second_per_gb"] = self.commands_per_second_per_gb
        if data["seconds_until_full"] is not None and math.isinf(data["seconds_until_full"]):
            data["seconds_until_full"] = None
        return data


def _per_entry(streams: list[StreamUsage]) -> float | None:
    length = sum(s.length for s in streams)
    return sum(s.bytes for s in streams) / length if length else None


def assess(
    settings: Settings,
    memory: tuple[int, int, str],
    dbsize: int,
    sample: KeySample,
    streams: list[StreamUsage],
    rate: float | None,
    rate_source: str,
    recent_commands_per_session: float | None = None,
) -> Capacity:
    """Put the measurements together: bytes per thing, per command, and time until full.

    Commands per session are ``recent_commands_per_session`` (commands ÷ spawns among
    lifecycle entries sampled over the streams, see that function); without one, dedupe record
    keys ÷ sessions (a layout with one record key per command)."""
    used, maxmemory, policy = memory
    lifecycle_names = set(lifecycle_streams(settings))
    result_names = {StreamKeys(settings.stream_prefix, s).results for s in range(settings.shards)}
    lifecycle = [s for s in streams if s.stream in lifecycle_names]
    results = [s for s in streams if s.stream in result_names]
    episodes = [s for s in streams if s.stream == episodes_stream(settings.stream_prefix)]
    dlqs = [s for s in streams if s.stream in dead_letter_streams(settings)]
    live = sample.estimate("live", dbsize)
    finished = sample.estimate("finished", dbsize)
    dedupes = sample.estimate(DEDUPE_KIND, dbsize)
    per_dedupe = sample.kinds[DEDUPE_KIND].bytes_each
    per_seq = sample.kinds[SEQ_KIND].bytes_each or 0.0
    seq_share = sample.estimate(SEQ_KIND, dbsize) / (live + finished) if live + finished else 0.0
    seq_share = min(1.0, seq_share)  # a session has at most one counter (publishers' choice)
    # A finished session's dedupe records go with its tombstone, kept for the longer of the
    # two windows, and its seq counter is kept as long after the terminate.
    tombstone_ttl = max(settings.tombstone_ttl_seconds, settings.dedupe_ttl_seconds)
    per_tombstone = sample.kinds["finished"].bytes_each
    per_live = sample.kinds["live"].bytes_each
    per_lifecycle, per_result = _per_entry(lifecycle), _per_entry(results)
    per_episode = _per_entry(episodes)
    commands_added = sum(s.entries_added for s in lifecycle)
    episodes_per_command = (
        sum(s.entries_added for s in episodes) / commands_added if commands_added else None
    )
    sessions = live + finished
    commands_per_session = recent_commands_per_session
    if commands_per_session is None and sessions and dedupes:
        commands_per_session = dedupes / sessions  # a layout with one record key per command
    # Dedupe record keys per command: those a session's own keys do not hold (refused commands).
    dedupe_share = 1.0 if dedupes else 0.0
    if sessions and commands_per_session:
        dedupe_share = min(1.0, dedupes / (sessions * commands_per_session))

    # What one command leaves, and for how long.
    parts: list[tuple[float, float]] = [
        (per_lifecycle or 0.0, settings.retention_seconds),
        (per_result or 0.0, settings.retention_seconds),
        ((per_dedupe or 0.0) * dedupe_share, settings.dedupe_ttl_seconds),
        ((per_episode or 0.0) * (episodes_per_command or 0.0), settings.retention_seconds),
    ]
    if per_tombstone and commands_per_session:
        parts.append((per_tombstone / commands_per_session, tombstone_ttl))
        parts.append((per_seq * seq_share / commands_per_session, tombstone_ttl))
    per_command = sum(b for b, _ in parts) or None
    byte_seconds = sum(b * s for b, s in parts) or None
    window_now = (
        sum(s.bytes for s in lifecycle + results + episodes)
        + dedupes * (per_dedupe or 0.0)
        + finished * (per_tombstone or 0.0)
    )
    window_now += sample.estimate(SEQ_KIND, dbsize) * per_seq
    per_finished = None if per_tombstone is None else per_tombstone + seq_share * per_seq
    steady: float | None = None
    if rate is not None and byte_seconds is not None:
        steady = max(0.0, used - window_now) + rate * byte_seconds
    seconds: float | None
    if maxmemory <= 0:
        seconds, verdict = None, "no maxmemory set: Redis grows until the machine runs out"
    elif rate is None:
        seconds, verdict = None, "rate unknown (no commands seen yet)"
    elif rate <= 0 or per_command is None:
        seconds, verdict = math.inf, "not filling (no commands arriving)"
    elif steady is not None and steady < maxmemory:
        seconds = math.inf
        verdict = (
            f"not filling: at this rate Redis levels off at {_mb(steady)} "
            f"({100 * steady / maxmemory:.0f} % of maxmemory)"
        )
    else:
        seconds = max(0.0, (maxmemory - used) / (rate * per_command))
        verdict = f"full in {_duration(seconds)} at this rate"
    if maxmemory > 0 and policy != "noeviction":
        verdict += (
            f"; maxmemory-policy {policy} evicts memworker's keys (sessions, dedupe records, "
            "tombstones) instead of refusing writes: set noeviction"
        )
    return Capacity(
        used_memory=used,
        maxmemory=maxmemory,
        maxmemory_policy=policy,
        keys=dbsize,
        keys_scanned=sample.scanned,
        scan_complete=sample.complete,
        live_sessions=live,
        finished_sessions=finished,
        dedupe_records=dedupes,
        bytes_per_live_session=per_live,
        bytes_per_finished_session=per_finished,
        bytes_per_tombstone=per_tombstone,
        commands_per_session=commands_per_session,
        bytes_per_dedupe_record=per_dedupe,
        bytes_per_lifecycle_entry=per_lifecycle,
        bytes_per_result_entry=per_result,
        commands_per_second=rate,
        rate_source=rate_source,
        bytes_per_command=per_command,
        byte_seconds_per_command=byte_seconds,
        window_bytes_now=window_now,
        steady_state_used_memory=steady,
        seconds_until_full=seconds,
        verdict=verdict,
        streams=streams,
        bytes_per_episodes_entry=per_episode,
        episodes_per_command=episodes_per_command,
        dead_letter_entries=sum(s.length for s in dlqs),
        dead_letter_bytes=sum(s.bytes for s in dlqs),
    )


async def measure_capacity(
    redis: Redis,
    settings: Settings,
    *,
    rate_seconds: float = 2.0,
    max_keys: int = 2_000,
    max_measured: int = 50,
) -> Capacity:
    """One capacity report (``memworker stats``). The rate is measured over ``rate_seconds``
    (two readings of entries-added); with 0, averaged over what the streams retain."""
    meter = RateMeter()
    if rate_seconds > 0:
        meter.add(await lifecycle_entries_added(redis, settings))
        started = time.monotonic()
    sample, _cursor = await sample_keys(
        redis, settings, max_keys=max_keys, max_measured=max_measured
    )
    dbsize = int(await redis.dbsize())
    memory = await read_memory(redis)
    if rate_seconds > 0:
        await asyncio.sleep(max(0.0, rate_seconds - (time.monotonic() - started)))
    streams = await stream_usage(redis, memworker_streams(settings))
    lifecycle = [s for s in streams if s.stream in set(lifecycle_streams(settings))]
    if rate_seconds > 0:
        meter.add(sum(s.entries_added for s in lifecycle))
        rate, source = meter.rate(), f"entries-added over {rate_seconds:g} s"
    else:
        rate, source = retained_rate(lifecycle), "average over the retained lifecycle entries"
    recent = await recent_commands_per_session(redis, settings)
    return assess(settings, memory, dbsize, sample, streams, rate, source, recent)


def _mb(value: float) -> str:
    return f"{value / 1_000_000:,.1f} MB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7_200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"


class CapacityProbe:
    """The capacity gauges, refreshed by the lag probe at a bounded cost per refresh: one SCAN
    page of ``keys_per_refresh`` keys (continuing the previous page's cursor), ``MEMORY
    USAGE`` of at most ``measured_per_refresh`` sessions (7 keys each) and dedupe records,
    ``XINFO STREAM`` + ``MEMORY USAGE`` per stream, ``INFO memory`` and ``DBSIZE``. Key
    counts come from the last complete SCAN cycle once there is one."""

    def __init__(
        self, settings: Settings, keys_per_refresh: int = 200, measured_per_refresh: int = 5
    ) -> None:
        self.settings = settings
        self.keys_per_refresh = keys_per_refresh
        self.measured_per_refresh = measured_per_refresh
        self.meter = RateMeter()
        self._cursor = 0
        self._sample = KeySample()
        self._complete: KeySample | None = None
        self._recent: float | None = None
        self._recent_stale = True
        self.last: Capacity | None = None

    async def refresh(self, redis: Any) -> Capacity:
        self._sample, self._cursor = await sample_keys(
            redis,
            self.settings,
            cursor=self._cursor,
            max_keys=self.keys_per_refresh,
            max_measured=self.measured_per_refresh,
            sample=self._sample,
        )
        if self._cursor == 0:  # a whole cycle seen: its counts are exact; start another
            self._complete, self._sample = self._sample, KeySample()
            self._recent_stale = True
        sample = self._complete or self._sample
        if self._recent_stale:  # once a SCAN cycle
            self._recent = await recent_commands_per_session(redis, self.settings)
            self._recent_stale = False
        streams = await stream_usage(redis, memworker_streams(self.settings))
        lifecycle = set(lifecycle_streams(self.settings))
        self.meter.add(sum(s.entries_added for s in streams if s.stream in lifecycle))
        capacity = assess(
            self.settings,
            await read_memory(redis),
            int(await redis.dbsize()),
            sample,
            streams,
            self.meter.rate(),
            f"entries-added over the last {self.meter.window_s:g} s of probes",
            self._recent,
        )
        self.last = capacity
        return capacity


class CapacityGauges:
    """Sets the capacity gauges of ``worker.metrics`` from a ``CapacityProbe``. A server that
    refuses a sampling command (an ACL without ``INFO``/``SCAN``/``MEMORY``) or a Redis
    Cluster (keys spread over nodes) turns them off with one log line; lag gauges go on."""

    def __init__(self, settings: Settings) -> None:
        self.probe = CapacityProbe(settings)
        self.enabled = not settings.redis_cluster

    async def refresh_gauges(self, redis: Any) -> None:
        if not self.enabled:
            return
        try:
            capacity = await self.probe.refresh(redis)
        except ResponseError as exc:
            if is_refused(exc):
                self.enabled = False
                log.warning("capacity_gauges_off", error=str(exc))
            else:  # a passing condition of the server: try again at the next probe
                log.warning("capacity_probe_failed", error=str(exc))
            return
        publish_gauges(capacity)


def is_refused(exc: ResponseError) -> bool:
    """The server will never answer these sampling commands (ACL, or not implemented)."""
    text = str(exc).lower()
    return isinstance(exc, NoPermissionError) or "unknown command" in text or "noperm" in text


def publish_gauges(capacity: Capacity) -> None:
    from worker import metrics

    metrics.REDIS_USED_MEMORY.set(capacity.used_memory)
    metrics.REDIS_MAX_MEMORY.set(capacity.maxmemory)
    for gauge, value in (
        (metrics.BYTES_PER_LIVE_SESSION, capacity.bytes_per_live_session),
        (metrics.BYTES_PER_FINISHED_SESSION, capacity.bytes_per_finished_session),
        (metrics.BYTES_PER_DEDUPE_RECORD, capacity.bytes_per_dedupe_record),
    ):
        if value is not None:
            gauge.set(value)
    metrics.DEAD_LETTERS_KEPT.set(capacity.dead_letter_entries)
    metrics.DEAD_LETTER_BYTES.set(capacity.dead_letter_bytes)
    for stream in capacity.streams:
        if stream.bytes_per_entry is not None:
            metrics.BYTES_PER_STREAM_ENTRY.labels(stream.stream).set(stream.bytes_per_entry)
    seconds = capacity.seconds_until_full
    metrics.SECONDS_UNTIL_FULL.set(math.inf if seconds is None else seconds)


def _bytes(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} B"


def render_capacity(c: Capacity, settings: Settings) -> str:
    """The capacity part of ``memworker stats``, as lines a person reads."""
    share = f" ({100 * c.used_memory / c.maxmemory:.1f} %)" if c.maxmemory else ""
    limit = _mb(c.maxmemory) if c.maxmemory else "no maxmemory"
    sampled = "every key" if c.scan_complete else f"a sample of {c.keys_scanned:,} keys"
    rate = "-" if c.commands_per_second is None else f"{c.commands_per_second:,.1f}"
    per_gb = c.commands_per_second_per_gb
    # One fact a line, each short enough for an 80-column terminal (no line wraps).
    lines = [
        f"Redis memory: {_mb(c.used_memory)} used of {limit}{share}, "
        f"policy {c.maxmemory_policy or '-'}",
        f"keys: {c.keys:,} (measured from {sampled})",
        f"  estimated live sessions {c.live_sessions:,.0f}, "
        f"finished sessions {c.finished_sessions:,.0f}",
        f"  estimated dedupe records {c.dedupe_records:,.0f}",
        f"bytes per live session {_bytes(c.bytes_per_live_session)}, "
        f"per finished session {_bytes(c.bytes_per_finished_session)}",
        f"  (tombstone {_bytes(c.bytes_per_tombstone)} + seq counter; "
        f"{c.commands_per_session or 0:.1f} commands a session)",
        f"bytes per dedupe record {_bytes(c.bytes_per_dedupe_record)}, "
        f"per lifecycle entry {_bytes(c.bytes_per_lifecycle_entry)}, "
        f"per results entry {_bytes(c.bytes_per_result_entry)}",
        f"  per episodes entry {_bytes(c.bytes_per_episodes_entry)} "
        f"({c.episodes_per_command or 0:.2f} a command)",
        f"one command leaves {_bytes(c.bytes_per_command)}: entries held "
        f"{settings.retention_seconds:g} s, dedupe record {settings.dedupe_ttl_seconds} s,",
        "  tombstone and seq counter shares "
        f"{max(settings.tombstone_ttl_seconds, settings.dedupe_ttl_seconds)} s",
        "1 GB sustains " + ("-" if per_gb is None else f"{per_gb:,.1f}") + " commands/s",
        f"dead letters: {c.dead_letter_entries:,} ({_mb(c.dead_letter_bytes)}; kept "
        f"{settings.dlq_max_entries:,} a DLQ, {settings.dlq_retention_seconds:g} s)",
        f"rate: {rate} commands/s ({c.rate_source})",
        c.verdict,
    ]
    return "\n".join(lines)
