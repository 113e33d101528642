"""Periodic side work beside a consumer loop (retention, lag, admission, retries): one runner.

A step that meets a server-wide Redis condition backs off (doubling, capped at 5 s) and is
tried again; any other error is logged and the step runs again at its next turn. Nothing but
``stop`` (or cancellation) ends it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.consumers.backoff import sleep_unless_stopped
from worker.logs import get_logger
from worker.metrics import REDIS_CONDITIONS
from worker.redis_conditions import ServerCondition, server_condition

log = get_logger("memworker.periodic")

_REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, RedisError)


async def run_every(
    every: float | Callable[[], float],
    step: Callable[[], Awaitable[object]],
    name: str,
    stop: asyncio.Event,
    on_failure: Callable[[ServerCondition | None], None] | None = None,
) -> None:
    """Await ``step`` every ``every`` seconds (a callable is asked before each wait) until
    ``stop`` is set. ``on_failure`` hears of each failed step: with the server condition met,
    or ``None`` for any other error."""

    def interval() -> float:
        return every() if callable(every) else every

    backoff = interval()
    while not stop.is_set():
        try:
            await step()
            backoff = interval()
        except _REDIS_ERRORS as exc:
            condition = server_condition(exc)
            if on_failure is not None:
                on_failure(condition)
            if condition is None:
                log.error("loop_error", loop=name, error=str(exc))
            else:
                REDIS_CONDITIONS.labels(condition.kind).inc()
                backoff = min(backoff * 2, 5.0)
                log.warning(
                    "redis_unavailable",
                    loop=name,
                    condition=condition.kind,
                    error=str(exc),
                    retry_in=backoff,
                )
        except Exception as exc:  # a bug must not end a periodic step for good
            if on_failure is not None:
                on_failure(None)
            log.exception("loop_error", loop=name, error=repr(exc))
        await sleep_unless_stopped(backoff, stop)
