"""A worker process frozen (SIGSTOP: a long GC pause, a stalled VM) while commands arrive."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests.faults.support import (
    assert_exactly_once,
    audit,
    ensure_groups,
    figures,
    lifecycle_order,
    log_errors,
    pending,
    publish_many,
    start_worker,
    stop_worker,
    wait_for_results,
)
from worker.settings import Settings

pytestmark = pytest.mark.faults

FROZEN_SECONDS = 5.0


async def test_a_frozen_worker_applies_what_it_was_handed_as_soon_as_it_thaws(
    redis: Redis, settings: Settings, tmp_path: Path
) -> None:
    """Frozen past its client's socket timeout, the worker loses the reply of the read in
    flight: the entries Redis delivered to it are its pending ones. Thawed, it reads them again
    at once (no other consumer exists, and the reclaim idle is 10 minutes) and says so."""
    await ensure_groups(redis, settings)
    log = tmp_path / "worker.log"
    env = {
        "MEMWORKER_REPLY_TIMEOUT_SECONDS": "2",  # the client's socket timeout too
        "MEMWORKER_RECLAIM_IDLE_MS": "600000",
    }
    proc = start_worker(settings, "frozen", log, **env)
    try:
        first = lifecycle_order(100, prefix="before")
        await publish_many(redis, settings, first)
        await wait_for_results(redis, settings, len(first), timeout=60)

        second = lifecycle_order(100, prefix="during")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            # At once: the worker's read in flight (BLOCK 100 ms) is handed these entries.
            await publish_many(redis, settings, second)
            await asyncio.sleep(FROZEN_SECONDS)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        thawed = time.monotonic()
        await wait_for_results(redis, settings, len(first) + len(second), timeout=60)
        caught_up = time.monotonic() - thawed
    finally:
        stop_worker(proc)

    report = await audit(redis, settings)
    assert_exactly_once(report, [body["event_id"] for body in first + second])
    assert await pending(redis, settings) == 0
    assert not log_errors(log), log_errors(log)
    assert "read failed" in log.read_text(), "the lost read went unreported"
    figures("frozen worker", frozen_s=FROZEN_SECONDS, caught_up_s=round(caught_up, 2))
