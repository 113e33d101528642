"""``episode.recorded`` on ``P:episodes``: announced right after the COMMIT, else by the relay.

``episodes.announced_at`` is the outbox: null until the episode's ``episode.recorded`` is
published. ``Announcer.announce`` publishes the episodes a transaction just committed and
marks them. What Redis refuses (a full Redis refuses XADD, ``denyoom``), or what a crash between
COMMIT and XADD left unpublished, ``Announcer.relay`` publishes later: oldest first, a bounded
batch at a time, run by ``Announcer.tick`` at start, every ``retry_s`` while something is owed
and every ``sweep_interval_s`` anyway (another consolidator's crash). At least once, exactly
once without a crash; the event's ``event_id`` is deterministic, so subscribers can drop a
duplicate.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.consumers.loop import StorageUnavailableError
from worker.db.batch import mark_announced, owed_announcements
from worker.db.models import EPISODE_NAMESPACE
from worker.db.outages import first_line
from worker.ids import uuid5_text
from worker.metrics import EPISODES_RECORDED


@dataclass(frozen=True, slots=True)
class Announcement:
    """An episode owed an ``episode.recorded`` (a ``worker.db.batch.EpisodeKey``)."""

    episode_id: uuid.UUID
    project_id: str
    session_id: str
    source_event_id: str

    def wire(self) -> bytes:
        """The event as JSON, built without the model: one per episode, on the hot path."""
        return recorded_wire(
            self.episode_id, self.project_id, self.session_id, self.source_event_id
        )


def recorded_wire(
    episode_id: uuid.UUID, project_id: str, session_id: str, source_event_id: str
) -> bytes:
    """``Announcement(...).wire()`` without the dataclass (a ``remember_many`` batch's
    thousand)."""
    episode = str(episode_id)
    return orjson.dumps(
        {
            "type": "episode.recorded",
            "event_id": uuid5_text(EPISODE_NAMESPACE, f"episode.recorded:{episode}"),
            "episode_id": episode,
            "project_id": project_id,
            "session_id": session_id,
            "causation_id": source_event_id,
        }
    )


class Announcer:
    """Publishes ``episode.recorded`` on ``stream`` and marks what it published (module doc).

    The relay publishes up to ``batch`` owed announcements per transaction, of episodes recorded
    at least ``grace_s`` ago (younger ones may be in the hands of another consolidator between
    its COMMIT and its XADD)."""

    def __init__(
        self,
        redis: Redis | RedisCluster,
        engine: AsyncEngine,
        stream: str,
        log: Any,
        *,
        batch: int = 500,
        grace_s: float = 10.0,
        retry_s: float = 1.0,
        sweep_interval_s: float = 60.0,
    ) -> None:
        self.redis = redis
        self.engine = engine
        self.stream = stream
        self.log = log
        self.batch = batch
        self.grace_s = grace_s
        self.retry_s = retry_s
        self.sweep_interval_s = sweep_interval_s
        self._owed = False
        """An announcement was refused: the relay runs every ``retry_s``, and new episodes
        wait for it (so they go out in order)."""
        self._last_relay = float("-inf")
        self._refused_at = float("-inf")

    async def announce(self, announcements: Sequence[Announcement]) -> int:
        """Publish ``episode.recorded`` for episodes just committed, then mark them announced;
        how many were. While the relay owes older ones, it publishes these too, after them."""
        if not announcements or self._owed:
            return 0
        published = await self._publish(announcements)
        if published:
            try:
                async with self.engine.begin() as conn:
                    await mark_announced(conn, [a.episode_id for a in published])
            except Exception as exc:
                error = f"postgres cannot be used: {first_line(exc)}"
                raise StorageUnavailableError(error) from exc
        return len(published)

    async def _publish(self, announcements: Sequence[Announcement]) -> list[Announcement]:
        """XADD each to ``P:episodes`` (one pipeline); the ones Redis accepted. A refusal (a
        full Redis) or an unreachable Redis leaves the rest owed: the relay publishes them."""
        pipe = self.redis.pipeline(transaction=False)
        for announcement in announcements:
            pipe.execute_command("XADD", self.stream, "*", "data", announcement.wire())
        try:
            replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            replies = [exc] * len(announcements)
        published = [
            a
            for a, reply in zip(announcements, replies, strict=True)
            if not isinstance(reply, Exception)
        ]
        if len(published) < len(announcements):
            refusal = next(r for r in replies if isinstance(r, Exception))
            if not self._owed:
                self.log.warning(
                    "episode.recorded refused, the relay will publish it",
                    owed=len(announcements) - len(published),
                    error=first_line(refusal),
                )
            self._owed = True
            self._refused_at = asyncio.get_running_loop().time()
        return published

    def _refused_recently(self) -> bool:
        """A refusal less than ``grace_s`` ago: those episodes are still too young for the
        relay to see, so it keeps coming back for them."""
        return asyncio.get_running_loop().time() - self._refused_at < self.grace_s

    async def tick(self) -> None:
        """The group loop's ``tick``: ``relay`` when due; never raises but for cancellation."""
        now = asyncio.get_running_loop().time()
        interval = self.retry_s if self._owed else self.sweep_interval_s
        if now - self._last_relay < interval:
            return
        self._last_relay = now
        try:
            await self.relay()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Postgres unavailable: the loop meets it too; retry later
            self._owed = True
            self.log.warning("announcement relay failed, will retry", error=first_line(exc))

    async def relay(self, max_batches: int = 10) -> int:
        """Publish episodes still owed an ``episode.recorded`` (``announced_at IS NULL``),
        oldest first, up to ``max_batches`` × ``batch``; how many were published. Each batch
        is one transaction: rows locked (``SKIP LOCKED``: two relays never take the same),
        XADD, marked; a refusal ends the run and leaves the rest owed."""
        total = 0
        owed = True
        for _ in range(max_batches):
            async with self.engine.begin() as conn:
                keys = await owed_announcements(conn, self.grace_s, self.batch)
                if not keys:
                    owed = self._refused_recently()
                    break
                wanted = [Announcement(*key) for key in keys]
                published = await self._publish(wanted)
                if published:
                    await mark_announced(conn, [a.episode_id for a in published])
            total += len(published)
            if len(published) < len(wanted):
                break
            if len(keys) < self.batch:
                owed = self._refused_recently()
                break
        self._owed = owed
        if total:
            EPISODES_RECORDED.inc(total)
            self.log.info("owed announcements published", count=total, still_owed=owed)
        return total
