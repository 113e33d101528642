"""Reading a consumer group: one XREADGROUP over many streams, or one per node on a cluster.

Replies in RESP2 or RESP3, with field names kept as Redis returned them (bytes) or as text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from worker.codec import text
from worker.consumers.entries import StreamEntry


async def read_group(
    redis: Redis | RedisCluster,
    group: str,
    consumer: str,
    positions: Mapping[str, str],
    *,
    count: int,
    block_ms: int | None,
    split: bool,
    raw_fields: bool,
) -> list[StreamEntry]:
    """Entries of ``group`` for ``consumer`` after each stream's position (``>``: new ones;
    an id: its own pending ones after it). ``split``: the streams live on different cluster
    nodes, which one XREADGROUP may not span (CROSSSLOT): one call each, none blocking, and a
    sleep of ``block_ms`` when all came back empty."""
    if split:
        entries: list[StreamEntry] = []
        for stream, position in positions.items():
            part: Any = await redis.xreadgroup(group, consumer, {stream: position}, count=count)
            entries += stream_entries(part, raw_fields)
        if not entries and block_ms:
            await asyncio.sleep(block_ms / 1000)
        return entries
    streams: Any = dict(positions)
    reply: Any = await redis.xreadgroup(group, consumer, streams, count=count, block=block_ms)
    return stream_entries(reply, raw_fields)


def stream_entries(reply: Any, raw_fields: bool) -> list[StreamEntry]:
    """The entries of an XREADGROUP or XAUTOCLAIM-shaped ``[(stream, [(id, fields)...])...]``
    reply; an entry deleted while pending comes with no fields."""
    if not reply:
        return []
    pairs: Iterable[tuple[Any, Any]] = reply.items() if isinstance(reply, dict) else reply
    entries: list[StreamEntry] = []
    for stream, stream_reply in pairs:
        rows = stream_reply
        if rows and isinstance(rows[0], list | tuple) and not isinstance(rows[0][0], bytes | str):
            rows = rows[0]  # RESP3 nests one level deeper
        name = text(stream)
        for entry_id, fields in rows:
            if raw_fields:
                entries.append(StreamEntry(name, text(entry_id), fields or {}))
            else:
                decoded = {text(k): v for k, v in (fields or {}).items()}
                entries.append(StreamEntry(name, text(entry_id), decoded))
    return entries
