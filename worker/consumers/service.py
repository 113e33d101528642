"""Running a consumer as a service: until asked to stop, in every state (starting, consuming,
riding out an outage), and the one shape of a group's service (``GroupService``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, Self

from worker.consumers.loop import GroupConsumer


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


class GroupService:
    """A group's handler that is also a service (the consolidator, the indexer): it owns its
    loop (``self.loop``) and, built by its ``from_settings``, the clients ``close`` closes."""

    loop: GroupConsumer[Any]
    _closers: tuple[Callable[[], Coroutine[Any, Any, Any]], ...] = ()

    def owning(self, *closers: Callable[[], Coroutine[Any, Any, Any]]) -> Self:
        """Close these (a client's ``aclose``, an engine's ``dispose``) in ``close``."""
        self._closers = closers
        return self

    async def close(self) -> None:
        for close in self._closers:
            await close()

    def is_ready(self) -> bool:
        """Its groups exist and the last step reached Redis and its storage."""
        return self.loop.is_ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set (``GroupConsumer.run``)."""
        await self.loop.run(stop)

    async def run_once(self) -> int:
        """Handle everything available now (``GroupConsumer.run_once``)."""
        return await self.loop.run_once()

    async def ensure_groups(self) -> None:
        await self.loop.ensure_groups()
