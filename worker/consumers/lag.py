"""A group's lag and pending count on its streams, as the same gauges for every group.

``memworker_stream_lag{stream,group}`` (entries not yet delivered to the group) and
``memworker_stream_pending{stream,group}`` (delivered, not acknowledged), from ``XINFO GROUPS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from worker.codec import text
from worker.metrics import STREAM_LAG, STREAM_PENDING


async def probe_group_lag(redis: Redis | RedisCluster, group: str, streams: Sequence[str]) -> None:
    """Set ``group``'s lag and pending gauges on each of ``streams``."""
    for stream in streams:
        groups: Any = await redis.xinfo_groups(stream)
        for info in groups:
            if text(info["name"]) == group:
                lag = info.get("lag")
                STREAM_LAG.labels(stream, group).set(float(lag or 0))
                STREAM_PENDING.labels(stream, group).set(float(info["pending"]))
