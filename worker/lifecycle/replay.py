"""Replay: re-read a stream range and apply it again.

Every effect is idempotent and every result id deterministic, so replaying a range twice
changes nothing the first replay did not; the summary says what changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from redis.asyncio import Redis

from worker.erasure.erased import load_erased
from worker.keys import LIFECYCLE_GROUP, StreamKeys
from worker.lifecycle.apply import CommandApplier
from worker.settings import Settings

Entries = list[tuple[bytes, dict[bytes, bytes]]]


async def read_range(
    redis: Redis, stream: str, start: str = "-", end: str = "+", batch: int = 500
) -> AsyncIterator[Entries]:
    """Batches of entries of ``stream`` from ``start`` to ``end`` inclusive."""
    low = start
    while True:
        rows: Any = await redis.xrange(stream, min=low, max=end, count=batch)
        if not rows:
            return
        yield rows
        if len(rows) < batch:
            return
        last = rows[-1][0].decode()
        ms, seq = last.split("-")
        low = f"{ms}-{int(seq) + 1}"


async def replay_lifecycle(
    redis: Redis,
    settings: Settings,
    shard: int,
    start: str = "-",
    end: str = "+",
    progress: Callable[[int], None] | None = None,
) -> Counter[str]:
    """Re-apply ``P:lifecycle:{shard}`` entries; counts of applied/rejected/duplicate/…;
    ``forgotten``: commands a ``memworker forget`` covered (``P:erased``), never applied."""
    applier = CommandApplier(redis, settings, LIFECYCLE_GROUP)
    try:
        await applier.ensure_scripts(look_first=True)  # as the operator: it loads no function
        stream = StreamKeys(settings.stream_prefix, shard).lifecycle
        erased = await load_erased(redis, settings.stream_prefix)
        counts: Counter[str] = Counter()
        async for rows in read_range(redis, stream, start, end, settings.batch_size):
            # commands, never dead letters: a ``source_id`` beside a command's ``data`` is no
            # source (worker.keys.is_dlq_stream)
            kept = [(i, f) for i, f in rows if not erased.covers_entry(i, f, dead_letter=False)]
            if len(kept) < len(rows):
                counts["forgotten"] += len(rows) - len(kept)
            for outcome in await applier.apply(shard, kept, dead_letters=False) if kept else []:
                counts[outcome.status] += 1
            if progress:
                progress(len(rows))
    finally:
        await applier.close()  # its pipelined connection
    return counts


async def count_range(redis: Redis, stream: str, start: str = "-", end: str = "+") -> int:
    """How many entries ``stream`` has from ``start`` to ``end`` (for a progress bar)."""
    if start == "-" and end == "+":
        return int(await redis.xlen(stream))
    total = 0
    async for rows in read_range(redis, stream, start, end, 5000):
        total += len(rows)
    return total
