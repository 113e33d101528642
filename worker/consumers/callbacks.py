"""A caller's callback run by a consumer group (``LifecycleHooks``, ``follow_changes``): what
they share.

- ``create_groups_waiting``: create the group on each stream, waiting out a Redis outage.
- ``is_unavailable`` / ``CallbackUnavailableError``: a callback that met a server-wide
  condition (a refused or timed-out connection, Redis loading, read-only, out of memory,
  busy…) says nothing about the entry: the handler raises ``CallbackUnavailableError`` (one of
  its ``storage_errors``), so the loop holds the entry and counts no failure against it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from worker.connections import AnyRedis
from worker.consumers.backoff import backoff_delay
from worker.consumers.groups import ensure_group
from worker.redis_conditions import is_server_condition


class CallbackUnavailableError(RuntimeError):
    """A callback met a server-wide condition: its entries are held and retried, none counted."""


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says a server is unreachable or not serving now (``worker.
    redis_conditions``), not that the entry is bad. Other ``OSError`` (a missing file) is the
    callback's own."""
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError):
        return False
    return is_server_condition(exc)


async def create_groups_waiting(
    redis: AnyRedis,
    streams: Sequence[str],
    group: str,
    start: str,
    stop: asyncio.Event,
    log: Any,
) -> bool:
    """Create ``group`` on each of ``streams`` where it does not exist yet, at ``start`` (``$``:
    after the last entry, ``0``: at the first retained one), backing off (logged) while Redis
    cannot be reached; ``False`` when ``stop`` was set first."""
    failures = 0
    while not stop.is_set():
        try:
            for stream in streams:
                await ensure_group(redis, stream, group, start)
            return True
        except (RedisError, OSError) as exc:
            failures += 1
            delay = backoff_delay(failures)
            log.warning("redis unavailable, retrying", error=str(exc), delay_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
    return False
