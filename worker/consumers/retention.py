"""Stream retention: trim what every group has finished with, and nothing else.

A blind ``MAXLEN`` can delete entries a group has not read or not acknowledged. Here a stream
is trimmed with ``MINID`` at the lowest of: each group's oldest pending entry, each group's
last-delivered id (+1), and now minus the retention period (kept for replay). A stream that no
group reads is trimmed by age only. A DLQ, which no group reads, is trimmed by age and length
(``trim_dead_letters``).
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoPermissionError, ResponseError


def _parse(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


async def safe_trim_id(redis: Redis | RedisCluster, stream: str, keep_seconds: float) -> str | None:
    """The id below which every entry is acknowledged by every group and older than
    ``keep_seconds``; None when nothing may be trimmed."""
    try:
        groups: Any = await redis.xinfo_groups(stream)
    except ResponseError:
        return None  # no such stream
    bound = (int(time.time() * 1000 - keep_seconds * 1000), 0)
    for group in groups:
        name = group["name"]
        last_ms, last_seq = _parse(group["last-delivered-id"])
        bound = min(bound, (last_ms, last_seq + 1))
        if int(group["pending"]):
            summary: Any = await redis.xpending(stream, name)
            if summary["min"]:
                bound = min(bound, _parse(summary["min"]))
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


async def trim_stream(redis: Redis | RedisCluster, stream: str, keep_seconds: float) -> int:
    """Trim ``stream`` up to its safe id; returns how many entries were removed."""
    min_id = await safe_trim_id(redis, stream, keep_seconds)
    if min_id is None:
        return 0
    removed: Any = await redis.xtrim(stream, minid=min_id, approximate=False)
    return int(removed)
