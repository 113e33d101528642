"""Commands whose stream id was given explicitly, far ahead of the clock.

Whoever may ``XADD`` to a lifecycle stream may name the entry's id (``XADD key
9999999999999-0 …``); Redis then gives every later auto id the same time (``9999999999999-1``,
``-2``, …), since ids only grow. Such an entry is dead-lettered (reason ``future_id``); the
auto-id commands after it are legitimate and applied as usual. Retention of such a stream does
not go by the ids' time (``worker.consumers.retention.ConsumedMarks``), and ``memworker stats``
and ``/metrics`` show the stream as ahead of the clock.

The rule: an entry more than ``AHEAD_TOLERANCE_MS`` ahead of Redis's clock is an explicit id
when the entry before it in the stream (or one deleted there: ``max-deleted-entry-id``) has
another time; an auto id after ``<ms>-<n>`` is ``<ms>-<n+1>``, the same time. When that cannot
be told (entries before it deleted and later ones too), it is applied: a command is never
dead-lettered on a guess.

Cost: while ids follow the clock, comparing each entry's id with the clock (no I/O). While a
shard is ahead, nothing more for a batch that continues the one before it (one consumer);
otherwise one ``XREVRANGE`` and one ``XINFO STREAM`` per batch, and a ``TIME`` per suspect.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from worker.stream_ids import AHEAD_TOLERANCE_MS

Id = tuple[int, int]


def parse_id(entry_id: bytes | str) -> Id:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class FutureIds:
    """Per shard, the last id seen and the skew of Redis's clock against this host's."""

    def __init__(self) -> None:
        self._last: dict[int, Id] = {}
        self.skew_ms = 0
        """Redis's clock minus this host's, as last measured (only measured when an id looks
        ahead, so a host clock behind Redis's costs one TIME, not one per batch)."""

    def ahead(self, shard: int, entries: Sequence[tuple[bytes | str, Any]]) -> list[int]:
        """Indices of the entries ahead of the clock (no I/O)."""
        limit = time.time() * 1000 + self.skew_ms + AHEAD_TOLERANCE_MS
        found = []
        for index, (raw_id, _fields) in enumerate(entries):
            ms = int((raw_id if isinstance(raw_id, str) else raw_id.decode()).partition("-")[0])
            if ms > limit:
                found.append(index)
        if not found and entries:
            self._last.pop(shard, None)  # a batch within the clock: nothing to continue
        return found

    async def screen(
        self,
        redis: Any,
        stream: str,
        shard: int,
        entries: Sequence[tuple[bytes | str, Mapping[bytes, bytes]]],
        ahead: list[int],
        redis_time: Any,
    ) -> dict[str, str]:
        """Of the entries ``ahead`` found, those with an explicit future id: entry id → why.
        ``redis_time``: an awaitable factory returning Redis's ``TIME`` reply."""
        ids = [parse_id(raw_id) for raw_id, _ in entries]
        suspects: list[int] = []
        for index in ahead:
            entry = ids[index]
            before = ids[index - 1] if index > 0 else self._last.get(shard)
            if before is not None and before[0] == entry[0] and before < entry:
                continue  # continues an id of the same time: an auto id
            suspects.append(index)
        self._last[shard] = max(ids)
        if not suspects:
            return {}
        info: Any = await redis.xinfo_stream(stream)
        deleted_raw = info.get("max-deleted-entry-id") if isinstance(info, dict) else None
        deleted = parse_id(deleted_raw) if deleted_raw else None
        reply: Any = await redis_time()
        server_ms = int(reply[0]) * 1000 + int(reply[1]) // 1000
        self.skew_ms = server_ms - int(time.time() * 1000)
        found: dict[str, str] = {}
        for index in suspects:
            entry = ids[index]
            ahead_ms = entry[0] - server_ms
            if ahead_ms <= AHEAD_TOLERANCE_MS:
                continue  # this host's clock was behind Redis's
            text = f"{entry[0]}-{entry[1]}"
            previous: Any = await redis.xrevrange(stream, f"({text}", "-", count=1)
            before = parse_id(previous[0][0]) if previous else None
            if deleted is not None and deleted < entry and (before is None or deleted > before):
                before = deleted
            if before is not None and before[0] == entry[0]:
                continue
            if deleted is not None and deleted > entry and before is None:
                continue  # what was before it is gone: cannot tell, so applied
            found[text] = (
                f"stream id {text} is {ahead_ms / 1000:.0f} s ahead of the server's clock and "
                "was given explicitly to XADD (an auto id continues the entry before it); "
                "publish with '*': later commands of this shard keep that time"
            )
        return found


def redis_clock(channel: Any) -> Callable[[], Awaitable[Any]]:
    """Redis's ``TIME`` through ``channel`` (a shard's script channel): the clock ``screen``
    compares ids with."""

    async def redis_time() -> Any:
        (reply,) = await channel.execute([["TIME"]])
        if isinstance(reply, Exception):
            raise reply
        return reply

    return redis_time
