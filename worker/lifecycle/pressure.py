"""Server-wide conditions as the lifecycle worker meets them, and memory pressure.

A condition (full, busy, loading, a failover: ``worker.redis_conditions``) holds the entries
it refused without counting an attempt, with a backoff that grows while it lasts. While Redis
is full (or admission is closed) what every group has finished with is trimmed at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from redis.exceptions import RedisError

from worker.lifecycle.apply import Outcome
from worker.lifecycle.held import RetryBook
from worker.logs import get_logger
from worker.metrics import REDIS_CONDITIONS, TRIMMED_WHILE_FULL
from worker.redis_conditions import ServerCondition, server_condition
from worker.settings import Settings

log = get_logger("memworker.lifecycle")


class ServerConditions:
    """The condition Redis reported last (None: it serves), and the entries it holds."""

    def __init__(self, settings: Settings, retry: RetryBook) -> None:
        self.settings = settings
        self.retry = retry
        self.current: ServerCondition | None = None
        self._streak = 0
        self._logged: dict[str, float] = {}

    @property
    def full(self) -> bool:
        return self.current is not None and self.current.kind == "full"

    def hold(
        self, shard: int, blocked: Sequence[Outcome], fields: Mapping[str, Mapping[bytes, bytes]]
    ) -> ServerCondition:
        """Redis refused these entries for a server-wide reason: not their fault. Hold them
        without counting an attempt, to be retried with a backoff that grows while the
        condition lasts (capped below the reclaim idle time, so the lease renewal keeps them
        ours). Logged once per 10 s per kind."""
        condition = server_condition(blocked[0].detail) or ServerCondition(
            "unreachable", blocked[0].detail
        )
        REDIS_CONDITIONS.labels(condition.kind).inc()
        self._streak += 1
        cap = min(5.0, self.settings.reclaim_idle_ms / 3000)
        delay = min(cap, 0.2 * 2 ** min(self._streak - 1, 10))
        for outcome in blocked:
            self.retry.hold(
                shard, outcome.entry_id, fields[outcome.entry_id], delay, waiting=False, error=False
            )
        now = time.monotonic()
        if now - self._logged.get(condition.kind, -60.0) >= 10.0:
            self._logged[condition.kind] = now
            log.warning(
                "redis_condition",
                condition=condition.kind,
                advice=condition.message,
                error=blocked[0].detail,
                held=len(blocked),
            )
        self.current = condition
        return condition

    def clear(self) -> bool:
        """Redis serves again: what the condition held goes first, not after its backoff, and
        a seq gap's clock starts now. True if a condition was in force."""
        self._streak = 0
        if self.current is None:
            return False
        log.debug("redis_condition_cleared", condition=self.current.kind)
        self.current = None
        now = time.monotonic()
        for held in self.retry.held.values():
            if held.waiting_since is not None:
                held.waiting_since = now
            if not held.waiting:
                held.due = min(held.due, now)
        return True


class FullTrimmer:
    """Redis is (nearly) full and accepted commands need memory to be applied: trim what every
    group has finished with now, not when the replay window ends (results stay replayable from
    Postgres: ``memworker replay results --source postgres``). Once a second at most."""

    def __init__(self, settings: Settings, trim: Callable[[float], Awaitable[int]]) -> None:
        self.settings = settings
        self.trim = trim
        self._task: asyncio.Task[None] | None = None
        self._logged_at, self._unlogged = -60.0, 0

    def soon(self) -> None:
        if self.settings.trim_when_full and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._trim())

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _trim(self) -> None:
        removed = 0
        try:
            removed = await self.trim(0)
        except (RedisError, OSError) as exc:
            log.warning("trim_while_full_failed", error=str(exc))
        if removed:
            TRIMMED_WHILE_FULL.inc(removed)
            self._unlogged += removed
            now = time.monotonic()
            if now - self._logged_at >= 10.0:  # once per 10 s at most
                log.warning(
                    "trimmed_while_full",
                    removed=self._unlogged,
                    advice="Redis is (nearly) full: entries every group had finished with were "
                    "trimmed before their replay window ended; raise maxmemory or lower the "
                    "offered rate",
                )
                self._logged_at, self._unlogged = now, 0
        await asyncio.sleep(1.0)
