"""Writing turns: ``Memory.remember`` and ``Memory.remember_many`` (``TurnWriter``).

Group commit, twice, shared by every ``Memory`` of a process on one engine and Redis client,
whatever its project (``SharedWrites``, ``shared_writes``). Concurrent ``remember`` calls are
inserted together: a round is one statement, whatever its projects, a transaction of its own
without BEGIN and COMMIT round trips (``turns.insert_pairs``: the rows and their owed
``episode.remembered`` events), and the calls that come while it commits make the next
round. Each caller goes on once its round committed (a conflicting id
fails that call alone, the others are stored), and returns: its turn and its owed
``episode.remembered`` are committed. Their publish follows, without the caller, shared with
the calls, of any project, that came meanwhile
(``worker.episodes.changes.OwedPublisher.publish_soon``: the events on the change feed and the
turns' ``episode.recorded`` on ``P:episodes`` in one Redis pipeline, marked in one
transaction). So under load a call costs a share of one transaction, and concurrent agents of
a project, or of ten projects, no longer queue one by one behind an outbox lock or for the
pool. A user's next turn is only sent once the last returned, so it is in a later round with
a later ``seq``, and a publish sends a project's events in ``seq`` order: the feed keeps each
user's order.

**Batches.** ``remember_many(episodes)`` stores up to ``MAX_REMEMBER_BATCH`` turns in one
round trip. A batch is refused whole, nothing stored: a bad item raises the input rule's
``InvalidInputError`` naming ``episodes[k].<field>``, a conflicting id ``EpisodeConflictError``
naming ``episodes[k]``, too many items ``BatchTooLargeError`` naming the limit. The same id
twice in a batch for one user with the same content is one turn (two users' are two).

When it returns, every turn is stored once with its event (owed in Postgres, published right
after by the publish on its way; ``Memory.flush_changes()`` waits for it) and found by words
at once, from any process.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from schemas.inputs import InvalidInputError
from schemas.limits import MAX_REMEMBER_BATCH
from worker.db.models import EPISODE_NAMESPACE
from worker.db.outages import is_connection_error
from worker.episodes.announcements import recorded_wire
from worker.episodes.changes import OwedPublisher
from worker.ids import uuid5_text, validate_write_id
from worker.user_memory import turns
from worker.user_memory.indexing import TurnVectors
from worker.user_memory.inputs import check_episode, checked_tool_json
from worker.user_memory.models import Episode, as_episode


class BatchTooLargeError(ValueError):
    """A ``remember_many`` of more than ``MAX_REMEMBER_BATCH`` turns (HTTP 413)."""


class SharedWrites:
    """The group commit of every ``Memory`` of a process on one engine and Redis client,
    whatever its project (module doc): ``insert`` joins the next round of turns, ``publisher``
    publishes their events. ``shared_writes`` gives each engine's."""

    def __init__(
        self, engine: AsyncEngine, redis: Redis | RedisCluster, prefix: str, shards: int
    ) -> None:
        self.engine = engine
        self.publisher = OwedPublisher(engine, redis, prefix, shards)
        self.users = 0
        self._waiting: list[tuple[str, Episode, asyncio.Future[turns.Stored | Exception]]] = []
        self._task: asyncio.Task[None] | None = None

    async def insert(self, project_id: str, episode: Episode) -> turns.Kept:
        """Store the turn in the next round (with its owed ``episode.remembered``)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and self._task.get_loop() is not loop:
            self._task, self._waiting = None, []  # a former event loop's (asyncio.run per call)
        future: asyncio.Future[turns.Stored | Exception] = loop.create_future()
        future.add_done_callback(_retrieve)
        self._waiting.append((project_id, episode, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._insert_waiting())
        stored = await asyncio.shield(future)
        if isinstance(stored, Exception):
            raise stored
        return stored

    async def _insert_waiting(self) -> None:
        """Insert the turns of concurrent ``remember`` calls together, a statement per
        round of up to ``MAX_REMEMBER_BATCH``, until none waits: each caller gets its turn's
        result (a conflict fails that call alone)."""
        while self._waiting:
            batch = self._waiting[:MAX_REMEMBER_BATCH]
            self._waiting = self._waiting[MAX_REMEMBER_BATCH:]
            first: dict[tuple[str, str | None, str], int] = {}
            unique: list[tuple[str, Episode]] = []
            for project_id, episode, _future in batch:
                if (project_id, *turns.turn_key(episode)) not in first:
                    first[project_id, *turns.turn_key(episode)] = len(unique)
                    unique.append((project_id, episode))
            try:
                stored = await self._insert_round(unique)
            except BaseException as exc:
                for _project, _episode, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            taken: set[int] = set()
            for project_id, episode, future in batch:
                k = first[project_id, *turns.turn_key(episode)]
                result = stored[k]
                if k in taken and not isinstance(result, Exception):
                    if turns.same_content(unique[k][1], episode):
                        result = result._replace(new=False, owed=False)  # announced by the other
                    else:
                        result = turns.EpisodeConflictError(
                            f"episode {episode.id!r} is already remembered with other content;"
                            " an episode is immutable: remember the change under a new id"
                        )
                taken.add(k)
                if not future.done():
                    future.set_result(result)

    async def _insert_round(
        self, unique: list[tuple[str, Episode]]
    ) -> list[turns.Stored | Exception]:
        """One round, one statement (``_round``); when Postgres refuses it for
        something other than an outage (a turn's data it will not hold), each turn alone, so
        one caller's bad turn fails that call only."""
        try:
            async with self._round() as conn:
                return await insert_projects(conn, unique)
        except Exception as exc:
            if len(unique) == 1 or is_connection_error(exc):
                raise
        results: list[turns.Stored | Exception] = []
        for one in unique:
            try:
                async with self._round() as conn:
                    results.extend(await insert_projects(conn, [one]))
            except Exception as exc:
                if is_connection_error(exc):
                    raise
                results.append(exc)
        return results

    @contextlib.asynccontextmanager
    async def _round(self) -> AsyncIterator[AsyncConnection]:
        """A round's connection: its one statement, of one project or several, is a
        transaction of its own (no BEGIN and COMMIT round trips; the turns and their events
        are still committed together or not at all)."""
        async with self.engine.connect() as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    async def close(self) -> None:
        """Stop a round or publish still running (what it owed stays owed)."""
        task, self._task, self._waiting = self._task, None, []
        await self.publisher.close()
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


_SHARED: weakref.WeakKeyDictionary[AsyncEngine, dict[tuple[int, str, int], SharedWrites]]
_SHARED = weakref.WeakKeyDictionary()


def shared_writes(
    engine: AsyncEngine, redis: Redis | RedisCluster, prefix: str, shards: int
) -> SharedWrites:
    """The engine's ``SharedWrites`` for this Redis client and stream layout (made on first
    use; counted: ``release`` it when done)."""
    by_engine = _SHARED.setdefault(engine, {})
    writes = by_engine.get((id(redis), prefix, shards))
    if writes is None or writes.publisher.redis is not redis:
        writes = by_engine[id(redis), prefix, shards] = SharedWrites(engine, redis, prefix, shards)
    writes.users += 1
    return writes


async def release(writes: SharedWrites) -> None:
    """One ``Memory`` less on ``writes``; the last one stops its rounds and forgets it."""
    writes.users -= 1
    if writes.users > 0:
        return
    by_engine = _SHARED.get(writes.engine, {})
    for key, found in list(by_engine.items()):
        if found is writes:
            del by_engine[key]
    await writes.close()


async def insert_projects(
    conn: AsyncConnection, unique: list[tuple[str, Episode]]
) -> list[turns.Stored | Exception]:
    """Insert ``(project, turn)`` pairs (distinct), whatever their projects, in one statement
    (``turns.insert_pairs``); each pair's result in order."""
    return list(await turns.insert_pairs(conn, unique, remembered_pairs(unique), indexed=False))


def remembered_pairs(pairs: list[tuple[str, Episode]]) -> list[dict[str, Any]]:
    """Each ``(project, turn)``'s ``episode.remembered``: ``change_event``'s, built a batch at
    a time with one time for them all (they commit in one statement), so its ``event_id``
    names the user too: two users' turns of one id in a batch get two."""
    now = datetime.now(UTC).isoformat()
    return [
        {
            "type": "episode.remembered",
            "event_id": uuid5_text(
                EPISODE_NAMESPACE, f"episode.remembered:{project_id}/{e.user_id or ''}/{e.id}/{now}"
            ),
            "project_id": project_id,
            "user_id": e.user_id,
            "occurred_at": now,
            "episode_id": e.id,
            "session_id": e.session_id,
        }
        for project_id, e in pairs
    ]


def remembered_events(project_id: str, episodes: list[Episode]) -> list[dict[str, Any]]:
    """Each turn's ``episode.remembered`` (``remembered_pairs``)."""
    return remembered_pairs([(project_id, e) for e in episodes])


class TurnWriter:
    """One ``Memory``'s turn writes, through its process's ``SharedWrites`` (module doc)."""

    def __init__(self, project_id: str, writes: SharedWrites, vectors: TurnVectors) -> None:
        self.project_id = project_id
        self.writes = writes
        self.vectors = vectors

    async def remember(self, episode: Episode | Any) -> str:
        validate_write_id(self.project_id, "project_id")  # a Memory of ".." still forgets
        episode = check_episode(as_episode(episode))
        stored = await self.writes.insert(self.project_id, episode)
        await self._after([episode], [stored])
        return episode.id

    async def remember_many(self, episodes: Iterable[Episode | Any]) -> list[str]:
        validate_write_id(self.project_id, "project_id")
        batch, tool_json = checked_batch(episodes)
        firsts = distinct(batch)
        unique = [batch[k] for k in firsts]
        if unique:
            async with self.writes.engine.begin() as conn:
                stored = await turns.insert_turns(
                    conn,
                    self.project_id,
                    unique,
                    remembered_events(self.project_id, unique),
                    tool_json=[tool_json[k] for k in firsts],
                )
                for result in stored:
                    if isinstance(result, Exception):
                        raise result  # the transaction rolls back: nothing of the batch stays
            await self._after(unique, [r for r in stored if not isinstance(r, Exception)])
        return [episode.id for episode in batch]

    async def _after(self, episodes: list[Episode], stored: list[turns.Kept]) -> None:
        """Embed the new turns when this memory embeds, then hand their events to the next
        publish without waiting for it (``OwedPublisher.publish_soon``: they are owed in
        Postgres since the insert committed)."""
        if any(k.new for k in stored) and await self.vectors.inline():  # no task a turn else
            await asyncio.gather(*(self.vectors.remembered(str(k.row_id)) for k in stored if k.new))
        project_id = self.project_id
        owed = [
            (kept.row_id, recorded_wire(kept.row_id, project_id, episode.session_id, kept.source))
            for episode, kept in zip(episodes, stored, strict=True)
            if kept.owed
        ]
        await self.writes.publisher.publish_soon(project_id, owed)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a round's failure seen: its caller may have been cancelled."""
    if not future.cancelled():
        future.exception()


def checked_batch(
    episodes: Iterable[Episode | Any],
) -> tuple[list[Episode], list[tuple[str, str | None]]]:
    """The batch's turns, each checked by the input rule, with their tool calls' and
    transcript's JSON (``checked_tool_json``: encoded once, for the check and the insert); the
    first bad one refuses the batch (``InvalidInputError`` naming ``episodes[k].<field>``), as
    does a batch too large."""
    if isinstance(episodes, str | bytes | dict | BaseModel) or not isinstance(episodes, Iterable):
        raise InvalidInputError("episodes", "must be a list of episodes")
    items = list(episodes)
    if len(items) > MAX_REMEMBER_BATCH:
        raise BatchTooLargeError(
            f"episodes: {len(items)} turns in one batch; the most is {MAX_REMEMBER_BATCH}"
            " (MAX_REMEMBER_BATCH): send smaller batches"
        )
    batch: list[Episode] = []
    tool_json: list[tuple[str, str | None]] = []
    for k, item in enumerate(items):
        try:
            episode = as_episode(item)
            tool_json.append(checked_tool_json(episode))
        except InvalidInputError as exc:
            raise InvalidInputError(f"episodes[{k}].{exc.field}", exc.problem) from exc
        except ValueError as exc:
            raise InvalidInputError(f"episodes[{k}]", str(exc).splitlines()[0]) from exc
        batch.append(episode)
    return batch, tool_json


def distinct(batch: list[Episode]) -> list[int]:
    """The indexes of the batch's turns without repeats: the same user's id twice with the
    same content is one turn (its first), with other content an ``EpisodeConflictError``
    naming both indexes."""
    first: dict[tuple[str | None, str], int] = {}
    out: list[int] = []
    for k, episode in enumerate(batch):
        seen = first.get(turns.turn_key(episode))
        if seen is None:
            first[turns.turn_key(episode)] = k
            out.append(k)
        elif turns.same_content(batch[seen], episode):
            continue
        else:
            raise turns.EpisodeConflictError(
                f"episodes[{k}]: episode {episode.id!r} is also episodes[{seen}] with other"
                " content; an episode is immutable: give each turn its own id"
            )
    return out
