"""What a stream's ids tell: ``XINFO STREAM``'s last, first and deleted ids, whether they ran
ahead of the clock (an entry given an explicit future id: ``worker.lifecycle.future_ids``),
and whether entries a group had not read were removed. Shared by the operator's views
(``worker.ops.inspection``), the lag gauges (``worker.consumers.lag``) and retention."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

AHEAD_TOLERANCE_MS = 60_000
"""An id more than this ahead of the clock is "in the future" (clocks of a primary and its
replicas, or of the worker and Redis, differ by far less)."""


def entry_id_pair(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True, slots=True)
class StreamIds:
    """What ``XINFO STREAM`` tells of a stream's ids (Redis 7: ``max-deleted-entry-id``)."""

    last: tuple[int, int]
    max_deleted: tuple[int, int] | None
    length: int
    first: tuple[int, int] | None
    """The first entry's id (None: the stream is empty)."""
    added: int | None = None
    """``entries-added``: every entry ever added (Redis 7)."""

    def ahead_seconds(self, now_ms: float) -> float | None:
        ahead = self.last[0] - now_ms
        return ahead / 1000 if ahead > AHEAD_TOLERANCE_MS else None

    def removed_unread(self, group: Mapping[Any, Any]) -> bool:
        """Whether entries the group had not read were removed: deleted by id above its
        last-delivered id (XDEL sets ``max-deleted-entry-id``), or trimmed (``XTRIM``, ``XADD
        … MAXLEN``: only the first entry moves) while every entry left is unread and fewer than
        its lag (``entries-added`` minus its ``entries-read``). Seen until the group reads past
        the gap: Redis then counts the removed entries as read."""
        delivered = entry_id_pair(group["last-delivered-id"])
        if self.max_deleted is not None and self.max_deleted > delivered:
            return True
        unread_all = self.first is None or self.first > delivered
        if not unread_all:
            return False
        if delivered == (0, 0) and self.added is not None:  # never read: all it missed
            return self.added > self.length
        lag = group.get("lag")
        return lag is not None and int(lag) > self.length


async def stream_ids(redis: Any, stream: str) -> StreamIds | None:
    """None for a stream that does not exist."""
    try:
        info: Any = await redis.xinfo_stream(stream)
    except ResponseError:
        return None
    deleted = info.get("max-deleted-entry-id")
    max_deleted = entry_id_pair(deleted) if deleted else None
    if max_deleted == (0, 0):
        max_deleted = None
    first = info.get("first-entry")
    return StreamIds(
        entry_id_pair(info["last-generated-id"]),
        max_deleted,
        int(info["length"]),
        entry_id_pair(first[0]) if first else None,
        int(info["entries-added"]) if "entries-added" in info else None,
    )
