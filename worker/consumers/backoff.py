"""Waiting after a failure: one exponential backoff and one stop-aware sleep for every loop."""

from __future__ import annotations

import asyncio
import contextlib


def backoff_delay(failures: int, initial_s: float = 0.1, max_s: float = 10.0) -> float:
    """Seconds to wait after ``failures`` failures in a row: ``initial_s`` doubled each time,
    capped at ``max_s``."""
    return float(min(max_s, initial_s * 2 ** min(max(failures, 1) - 1, 30)))


async def sleep_unless_stopped(seconds: float, stop: asyncio.Event) -> None:
    """Sleep ``seconds``, but wake at once when ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
