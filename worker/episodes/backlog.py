"""The indexing backlog: episodes announced on ``P:episodes`` that the indexer has not indexed
yet, and the age of the oldest of them.

Announcements are the indexer's to-do list, in order, so the backlog is read off its consumer
group, never off the episodes table: the entries delivered but not acknowledged (``pending``)
plus those not delivered yet (``lag``), and the oldest is the first pending entry or, with
none, the first entry after the group's last delivered one (a stream id is its time). That is
``XINFO GROUPS``, ``XPENDING`` (summary) and one ``XRANGE … COUNT 1``, whatever the backlog's
size, and no Postgres at all; the indexer runs it every ``MEMWORKER_LAG_PROBE_SECONDS``
(``memworker_index_backlog``, ``memworker_index_oldest_unindexed_seconds``), ``memworker
stats`` once. Episodes announced while the indexer was running without pgvector, or embedded
by an older model (``memworker reindex`` backfills those), and entries dead-lettered
(``P:dlq:episodes``) are not counted: nothing is on its way to index them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from worker.codec import text
from worker.keys import episodes_stream
from worker.metrics import INDEX_BACKLOG, INDEX_OLDEST_UNINDEXED

LAG_UNKNOWN_CAP = 100_000
"""When Redis does not know the group's lag (entries deleted below it), the entries after its
last delivered one are counted, up to this many."""


def _ms(entry_id: bytes | str) -> int:
    return int(text(entry_id).split("-", 1)[0])


@dataclass(frozen=True, slots=True)
class IndexingBacklog:
    episodes: int
    """Announcements on ``P:episodes`` the indexer has not finished (pending + not delivered)."""
    oldest_ms: int | None
    """When the oldest of them was announced (ms since the epoch); None: no backlog."""

    def oldest_age_s(self, now: float | None = None) -> float | None:
        """Seconds since the oldest unindexed episode was announced; None without backlog."""
        if self.oldest_ms is None:
            return None
        return max(0.0, (now if now is not None else time.time()) - self.oldest_ms / 1000)

    def as_dict(self) -> dict[str, Any]:
        age = self.oldest_age_s()
        return {
            "backlog": self.episodes,
            "oldest_unindexed_age_s": None if age is None else round(age, 3),
        }


async def _first_after(redis: Redis | RedisCluster, stream: str, after: str) -> int | None:
    entries: Any = await redis.xrange(stream, min=after, count=1)
    return _ms(entries[0][0]) if entries else None


async def indexing_backlog(
    redis: Redis | RedisCluster, prefix: str, group: str = "indexer"
) -> IndexingBacklog:
    """The indexer's backlog on ``P:episodes`` (``group``: its consumer group)."""
    stream = episodes_stream(prefix)
    try:
        groups: Any = await redis.xinfo_groups(stream)
    except ResponseError:  # no stream: nothing was ever announced
        return IndexingBacklog(0, None)
    info = next((g for g in groups if text(g["name"]) == group), None)
    if info is None:  # the indexer never ran: everything announced waits
        length = int(await redis.xlen(stream))
        return IndexingBacklog(length, await _first_after(redis, stream, "-") if length else None)
    pending = int(info["pending"])
    last = text(info["last-delivered-id"])
    lag = info.get("lag")
    if lag is None:
        later: Any = await redis.xrange(stream, min=f"({last}", count=LAG_UNKNOWN_CAP)
        lag = len(later)
    oldest: int | None = None
    if pending:
        summary: Any = await redis.xpending(stream, group)
        if summary["min"]:
            oldest = _ms(summary["min"])
    if oldest is None and int(lag):
        oldest = await _first_after(redis, stream, f"({last}")
    return IndexingBacklog(pending + int(lag), oldest)


async def probe_indexing_backlog(
    redis: Redis | RedisCluster, prefix: str, group: str = "indexer"
) -> IndexingBacklog:
    """``indexing_backlog``, and set its gauges."""
    backlog = await indexing_backlog(redis, prefix, group)
    INDEX_BACKLOG.set(backlog.episodes)
    INDEX_OLDEST_UNINDEXED.set(backlog.oldest_age_s() or 0.0)
    return backlog
