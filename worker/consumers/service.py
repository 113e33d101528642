"""Running a service until asked to stop, in every state: starting, consuming, riding out an
outage. A start-up step that hangs is cancelled when the stop comes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


async def run_until_stopped(
    start: Callable[[], Coroutine[Any, Any, bool]],
    stop: asyncio.Event,
    stopping: asyncio.Event,
    close: Callable[[], Coroutine[Any, Any, None]],
) -> None:
    """Await ``start()`` (which retries while servers are unreachable and returns early once
    ``stopping`` is set), then wait for ``stop``; ``close()`` always runs at the end. A start
    that is no outage but a failure ends the run with its exception."""
    starting = asyncio.create_task(start())
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            await starting
            await stop.wait()
        else:
            stopping.set()  # the start-up retry loop notices between tries ...
            await asyncio.wait({starting}, timeout=1.0)
            starting.cancel()  # ... and a try that hangs is cancelled
            with contextlib.suppress(asyncio.CancelledError):
                await starting
    finally:
        stopped.cancel()
        await close()
