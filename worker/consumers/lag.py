"""A group's lag and pending count on its streams, as the same gauges for every group.

``memworker_stream_lag{stream,group}`` (entries not yet delivered to the group) and
``memworker_stream_pending{stream,group}`` (delivered, not acknowledged), from ``XINFO GROUPS``;
from ``XINFO STREAM``, ``memworker_stream_removed_unread{stream,group}`` (entries removed
before the group read them) and ``memworker_stream_ids_ahead_seconds{stream}`` (ids ahead of
the clock: ``worker.lifecycle.future_ids``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from worker.codec import text
from worker.logs import get_logger
from worker.metrics import STREAM_IDS_AHEAD, STREAM_LAG, STREAM_PENDING, STREAM_REMOVED_UNREAD
from worker.stream_ids import stream_ids

log = get_logger("worker.consumers.lag")

_warned: set[tuple[str, str]] = set()
"""(condition, stream or stream/group) already logged: one warning when it starts, not one per
probe (a stream can stay ahead of the clock for good)."""


def _warn_once(condition: str, subject: str, present: bool, **fields: Any) -> None:
    key = (condition, subject)
    if not present:
        _warned.discard(key)
    elif key not in _warned:
        _warned.add(key)
        log.warning(condition, **fields)


async def probe_group_lag(redis: Redis | RedisCluster, group: str, streams: Sequence[str]) -> None:
    """Set ``group``'s lag and pending gauges on each of ``streams``."""
    for stream in streams:
        groups: Any = await redis.xinfo_groups(stream)
        ids = await stream_ids(redis, stream)
        ahead = None if ids is None else ids.ahead_seconds(time.time() * 1000)
        STREAM_IDS_AHEAD.labels(stream).set(ahead or 0.0)
        _warn_once(
            "stream_ids_ahead_of_clock",
            stream,
            ahead is not None,
            stream=stream,
            ahead_seconds=round(ahead or 0),
        )
        for info in groups:
            if text(info["name"]) == group:
                lag = info.get("lag")
                STREAM_LAG.labels(stream, group).set(float(lag or 0))
                STREAM_PENDING.labels(stream, group).set(float(info["pending"]))
                removed = ids is not None and ids.removed_unread(info)
                STREAM_REMOVED_UNREAD.labels(stream, group).set(1.0 if removed else 0.0)
                _warn_once(
                    "stream_entries_removed_unread",
                    f"{stream}/{group}",
                    removed,
                    stream=stream,
                    group=group,
                )
