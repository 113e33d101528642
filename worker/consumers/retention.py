"""Stream retention: trim what every group has finished with, and nothing else.

A blind ``MAXLEN`` can delete entries a group has not read or not acknowledged. Here a stream
is trimmed with ``MINID`` at the lowest of: each group's oldest pending entry, each group's
last-delivered id (+1), and now minus the retention period (kept for replay). A stream that no
group reads is trimmed by age only. A DLQ, which no group reads, is trimmed by age and length
(``trim_dead_letters``).

An entry id's time is whatever its writer said: ``XADD key 9999999999999-0 …`` is accepted, and
every auto id after it (``9999999999999-1``, …) is "in the future" too, so trimming by id time
alone would keep those entries for good. When the point every group has consumed is ahead of the
clock, ``ConsumedMarks`` remembers (that point, when it was seen) on each pass; once a mark is
``keep_seconds`` old, everything below it is trimmed: those entries were all in the stream, and
consumed, when the mark was taken (ids only grow), so each is kept at least ``keep_seconds``
after it was read. Cost: nothing while ids follow the clock; while they do not, one small tuple
per stream per retention pass, in memory (a restarted worker starts over, so such entries may
stay up to one retention period longer).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoPermissionError, ResponseError

from worker.stream_ids import AHEAD_TOLERANCE_MS


def _parse(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class ConsumedMarks:
    """Per stream, the points every group had consumed, and when, seen while that point was
    ahead of the clock (the module's docstring)."""

    def __init__(self) -> None:
        self._marks: dict[str, deque[tuple[tuple[int, int], float]]] = {}

    def note(self, stream: str, consumed: tuple[int, int], now: float) -> None:
        marks = self._marks.setdefault(stream, deque())
        if not marks or consumed > marks[-1][0]:
            marks.append((consumed, now))

    def usable(self, stream: str, now: float, keep_seconds: float) -> tuple[int, int] | None:
        """The highest mark at least ``keep_seconds`` old (older ones are dropped)."""
        marks = self._marks.get(stream)
        found = None
        while marks and marks[0][1] <= now - keep_seconds:
            found = marks.popleft()[0]
        return found


async def safe_trim_id(
    redis: Redis | RedisCluster,
    stream: str,
    keep_seconds: float,
    marks: ConsumedMarks | None = None,
) -> str | None:
    """The id below which every entry is acknowledged by every group and older than
    ``keep_seconds`` (by its id's time, or with ``marks`` by when it was seen consumed, for
    entries whose ids are ahead of the clock); None when nothing may be trimmed."""
    try:
        groups: Any = await redis.xinfo_groups(stream)
    except ResponseError:
        return None  # no such stream
    now = time.time()
    bound = (int(now * 1000 - keep_seconds * 1000), 0)
    consumed: tuple[int, int] | None = None
    for group in groups:
        name = group["name"]
        last_ms, last_seq = _parse(group["last-delivered-id"])
        point = (last_ms, last_seq + 1)
        if int(group["pending"]):
            summary: Any = await redis.xpending(stream, name)
            if summary["min"]:
                point = min(point, _parse(summary["min"]))
        consumed = point if consumed is None else min(consumed, point)
    if consumed is not None:
        bound = min(bound, consumed)
        if marks is not None:
            if consumed[0] > now * 1000 + AHEAD_TOLERANCE_MS:
                marks.note(stream, consumed, now)
            seen = marks.usable(stream, now, keep_seconds)
            if seen is not None:
                bound = max(bound, min(seen, consumed))
    if bound <= (0, 0):
        return None
    return f"{bound[0]}-{bound[1]}"


async def trim_dead_letters(
    redis: Redis | RedisCluster, stream: str, max_entries: int, keep_seconds: float
) -> int:
    """Trim a DLQ stream to dead letters younger than ``keep_seconds`` and to its newest
    ``max_entries`` (0: either not at all); returns how many were removed. A user its ACL
    does not let trim the stream (``NOPERM``) leaves it, as ``safe_trim_id`` leaves a stream it
    may not inspect."""
    removed = 0
    try:
        if keep_seconds > 0:
            min_id = f"{int(time.time() * 1000 - keep_seconds * 1000)}-0"
            removed += int(await redis.xtrim(stream, minid=min_id, approximate=False))
        if max_entries > 0:
            removed += int(await redis.xtrim(stream, maxlen=max_entries, approximate=False))
    except NoPermissionError:
        return removed
    return removed


async def trim_stream(
    redis: Redis | RedisCluster,
    stream: str,
    keep_seconds: float,
    marks: ConsumedMarks | None = None,
) -> int:
    """Trim ``stream`` up to its safe id; returns how many entries were removed."""
    min_id = await safe_trim_id(redis, stream, keep_seconds, marks)
    if min_id is None:
        return 0
    removed: Any = await redis.xtrim(stream, minid=min_id, approximate=False)
    return int(removed)
