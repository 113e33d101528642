"""One consumer loop per stream, side by side: a cluster node that stops answering holds only
its own streams.

On a Redis Cluster one XREADGROUP cannot span streams on different nodes, so a loop reading
many streams reads them one after another; a node that died without closing its connections
(a host gone, a container killed on a bridge network) then holds every stream behind it until
its read times out (``MEMWORKER_REPLY_TIMEOUT_SECONDS``). ``run_side_by_side`` runs instead one
``GroupConsumer`` per stream, each with its own reads, timeouts, backoff, own pending entries
and reclaim, while the loop that started them keeps the group-wide steps (the lag probe, the
handler's ``tick``). A step of one of them that fails for a server-wide condition is an
outage of that stream only: its loop backs off and resumes; nothing is poison.

The handler must allow ``finish`` calls of different streams at once (the lifecycle worker
does: it only sends each batch to its node).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from worker.consumers.backoff import sleep_unless_stopped
from worker.logs import get_logger

GroupConsumer = Any
"""``worker.consumers.loop.GroupConsumer``, which imports this module (named, not imported)."""
log = get_logger("worker.consumers.side_by_side")


class OneStream:
    """``handler`` seen as the handler of one of its streams only (everything else is its)."""

    def __init__(self, handler: Any, stream: str) -> None:
        self._handler = handler
        self.streams: Sequence[str] = [stream]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handler, name)


def one_loop_per_stream(loop: GroupConsumer) -> list[GroupConsumer]:
    """A loop like ``loop`` (same consumer, same settings) for each of its streams; the
    group-wide steps (lag probe, ``tick``) stay with ``loop``."""
    return [
        type(loop)(
            loop.redis,
            OneStream(loop.handler, stream),
            consumer=loop.consumer,
            batch_size=loop.batch_size,
            block_ms=loop.block_ms,
            max_attempts=loop.max_attempts,
            reclaim_idle_ms=loop.reclaim_idle_ms,
            reclaim_interval_s=loop.reclaim_interval_s,
            backoff_initial_s=loop.backoff_initial_s,
            backoff_max_s=loop.backoff_max_s,
            storage_check_interval_s=loop.storage_check_interval_s,
            retry_window_s=loop.retry_window_s,
        )
        for stream in loop.streams
    ]


async def run_side_by_side(
    loop: GroupConsumer, parts: Sequence[GroupConsumer], stop: asyncio.Event
) -> None:
    """Run ``parts`` (``one_loop_per_stream(loop)``) until ``stop`` is set, each finishing
    its batch in hand; meanwhile ``loop`` probes the lag and calls its ``tick`` every
    ``block_ms``."""
    tasks = [asyncio.create_task(part.run(stop)) for part in parts]
    last_probe: float | None = None
    try:
        while not stop.is_set() and not all(task.done() for task in tasks):
            now = asyncio.get_running_loop().time()
            try:
                if loop.lag_probe_s is not None and (
                    last_probe is None or now - last_probe >= loop.lag_probe_s
                ):
                    last_probe = now
                    await loop.probe_lag()
                if loop.tick is not None:
                    await loop.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the streams' own loops report and ride out outages
                log.warning("group step failed, retrying", group=loop.group, error=str(exc))
            await sleep_unless_stopped(loop.block_ms / 1000, stop)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
