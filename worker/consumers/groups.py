"""Consumer groups and consumer names: created once, found again after a restart.

A group is created at id ``0`` with ``MKSTREAM``; a full Redis refuses even that for a group
that exists, so then the group is looked up instead.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from worker.codec import text
from worker.redis_conditions import is_server_condition


def default_consumer_name() -> str:
    """Unique per process, so a restarted process never inherits a dead one's identity."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


async def ensure_group(
    redis: Redis | RedisCluster, stream: str, group: str, start: str = "0"
) -> None:
    """Create ``group`` at ``start`` (``0``: the first entry kept; ``$``: after the last) on
    ``stream`` (and the stream) unless it exists.

    A full Redis refuses XGROUP CREATE even for a group that exists: then the group is looked
    up, so a consumer restarted while Redis is full starts (and holds its entries)."""
    try:
        await redis.xgroup_create(stream, group, id=start, mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return
        if not is_server_condition(exc) or not await _group_exists(redis, stream, group):
            raise


async def _group_exists(redis: Redis | RedisCluster, stream: str, group: str) -> bool:
    try:
        groups: Any = await redis.xinfo_groups(stream)
    except ResponseError:
        return False
    return any(text(g["name"]) == group for g in groups)


async def delivery_counts(
    redis: Redis | RedisCluster, stream: str, group: str, entry_ids: Sequence[str]
) -> dict[str, int]:
    """How often each of these pending entries was delivered (one XPENDING each, in one
    pipeline: a range query could stop short at other pending entries of the consumer)."""
    pipe = redis.pipeline(transaction=False)
    for entry_id in entry_ids:
        pipe.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    counts: dict[str, int] = {}
    for rows in await pipe.execute():
        for row in rows:
            counts[text(row["message_id"])] = int(row["times_delivered"])
    return counts


async def renew_leases(
    redis: Redis | RedisCluster, stream: str, group: str, consumer: str, entry_ids: Sequence[str]
) -> set[str]:
    """Claim these entries for ``consumer`` again (idle time reset, so nobody reclaims them
    while it still means to handle them); returns the ids still pending, the others were
    acknowledged elsewhere or trimmed."""
    with_lease: Any = await redis.xclaim(
        stream, group, consumer, min_idle_time=0, message_ids=list(entry_ids), justid=True
    )
    return {text(entry_id) for entry_id in with_lease}
