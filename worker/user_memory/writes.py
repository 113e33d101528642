"""Writing turns: ``Memory.remember`` and ``Memory.remember_many`` (``TurnWriter``).

Group commit, twice. Concurrent ``remember`` calls of one ``Memory`` are inserted together: a
round is one transaction of one statement (``turns.insert_turns``: the rows and their owed
``episode.remembered`` events), and the calls that come while it commits make the next one;
each caller goes on once its round committed (a conflicting id fails that call alone, the
others are stored). Then one publish shared with the calls that came meanwhile
(``worker.episodes.changes.OwedPublisher``: the events on the change feed and the turns'
``episode.recorded`` on ``P:episodes`` in one Redis pipeline, marked in one transaction). So
under load a call costs a share of two transactions and a pipeline, and concurrent agents of
a project no longer queue one by one behind its outbox lock. A user's next turn is only sent
once the last returned, so it is in a later round: the feed keeps each user's order.

**Batches.** ``remember_many(episodes)`` stores up to ``MAX_REMEMBER_BATCH`` turns in one
round trip. A batch is refused whole, nothing stored: a bad item raises the input rule's
``InvalidInputError`` naming ``episodes[k].<field>``, a conflicting id ``EpisodeConflictError``
naming ``episodes[k]``, too many items ``BatchTooLargeError`` naming the limit. The same id
twice in a batch for one user with the same content is one turn (two users' are two).

When it returns, every turn is stored once with its event (published, or owed to the next
publish when Redis refused it) and found by words at once, from any process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from schemas.inputs import InvalidInputError
from schemas.limits import MAX_REMEMBER_BATCH
from worker.db.outages import is_connection_error
from worker.episodes.announcements import Announcement
from worker.episodes.changes import OwedPublisher, change_event
from worker.logs import get_logger
from worker.user_memory import turns
from worker.user_memory.indexing import TurnVectors
from worker.user_memory.inputs import check_episode
from worker.user_memory.models import Episode, as_episode

log = get_logger("worker.user_memory")


class BatchTooLargeError(ValueError):
    """A ``remember_many`` of more than ``MAX_REMEMBER_BATCH`` turns (HTTP 413)."""


class TurnWriter:
    """One ``Memory``'s turn writes (module doc)."""

    def __init__(self, project_id: str, publisher: OwedPublisher, vectors: TurnVectors) -> None:
        self.project_id = project_id
        self.publisher = publisher
        self.vectors = vectors
        self._waiting: list[tuple[Episode, asyncio.Future[turns.Stored | Exception]]] = []
        self._task: asyncio.Task[None] | None = None

    async def remember(self, episode: Episode | Any) -> str:
        episode = check_episode(as_episode(episode))
        loop = asyncio.get_running_loop()
        if self._task is not None and self._task.get_loop() is not loop:
            self._task, self._waiting = None, []  # a former event loop's (asyncio.run per call)
        future: asyncio.Future[turns.Stored | Exception] = loop.create_future()
        future.add_done_callback(_retrieve)
        self._waiting.append((episode, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._insert_waiting())
        stored = await asyncio.shield(future)
        if isinstance(stored, Exception):
            raise stored
        await self._after([episode], [stored])
        return episode.id

    async def remember_many(self, episodes: Iterable[Episode | Any]) -> list[str]:
        batch = checked_batch(episodes)
        unique = distinct(batch)
        if unique:
            async with self.publisher.engine.begin() as conn:
                stored = await turns.insert_turns(
                    conn, self.project_id, unique, self._events(unique)
                )
                for result in stored:
                    if isinstance(result, Exception):
                        raise result  # the transaction rolls back: nothing of the batch stays
            await self._after(unique, [r for r in stored if not isinstance(r, Exception)])
        return [episode.id for episode in batch]

    async def _insert_waiting(self) -> None:
        """Insert the turns of concurrent ``remember`` calls together, a transaction per
        round of up to ``MAX_REMEMBER_BATCH``, until none waits: each caller gets its turn's
        result (a conflict fails that call alone)."""
        while self._waiting:
            batch = self._waiting[:MAX_REMEMBER_BATCH]
            self._waiting = self._waiting[MAX_REMEMBER_BATCH:]
            first: dict[tuple[str | None, str], int] = {}
            unique: list[Episode] = []
            for episode, _future in batch:
                if turns.turn_key(episode) not in first:
                    first[turns.turn_key(episode)] = len(unique)
                    unique.append(episode)
            try:
                stored = await self._insert_round(unique)
            except BaseException as exc:
                for _episode, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            taken: set[int] = set()
            for episode, future in batch:
                k = first[turns.turn_key(episode)]
                result = stored[k]
                if k in taken and not isinstance(result, Exception):
                    if turns.same_content(unique[k], episode):
                        result = result._replace(new=False, owed=False)  # announced by the other
                    else:
                        result = turns.EpisodeConflictError(
                            f"episode {episode.id!r} is already remembered with other content;"
                            " an episode is immutable: remember the change under a new id"
                        )
                taken.add(k)
                if not future.done():
                    future.set_result(result)

    async def _insert_round(self, unique: list[Episode]) -> list[turns.Stored | Exception]:
        """One round in one transaction; when Postgres refuses it for something other than
        an outage (a turn's data it will not hold), each turn alone, so one caller's bad turn
        fails that call only."""
        try:
            async with self.publisher.engine.begin() as conn:
                return list(
                    await turns.insert_turns(
                        conn, self.project_id, unique, self._events(unique), indexed=False
                    )
                )
        except Exception as exc:
            if len(unique) == 1 or is_connection_error(exc):
                raise
        results: list[turns.Stored | Exception] = []
        for episode in unique:
            try:
                async with self.publisher.engine.begin() as conn:
                    [one] = await turns.insert_turns(
                        conn, self.project_id, [episode], self._events([episode]), indexed=False
                    )
                results.append(one)
            except Exception as exc:
                if is_connection_error(exc):
                    raise
                results.append(exc)
        return results

    def _events(self, episodes: list[Episode]) -> list[dict[str, Any]]:
        return [
            change_event(
                "episode.remembered",
                self.project_id,
                e.user_id,
                e.id,
                episode_id=e.id,
                session_id=e.session_id,
            )
            for e in episodes
        ]

    async def _after(self, episodes: list[Episode], stored: list[turns.Kept]) -> None:
        """Embed the new turns when this memory embeds, then publish (group commit)."""
        await asyncio.gather(*(self.vectors.remembered(str(k.row_id)) for k in stored if k.new))
        owed = [
            self._announcement(episode, kept)
            for episode, kept in zip(episodes, stored, strict=True)
            if kept.owed
        ]
        try:
            await self.publisher.flush(owed)
        except Exception as exc:  # stored: the events stay owed to the next publish
            log.warning("change feed: events stay owed", error=str(exc).splitlines()[:1])

    def _announcement(self, episode: Episode, kept: turns.Kept) -> tuple[Any, bytes]:
        wire = Announcement(kept.row_id, self.project_id, episode.session_id, kept.source).wire()
        return kept.row_id, wire


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a round's failure seen: its caller may have been cancelled."""
    if not future.cancelled():
        future.exception()


def checked_batch(episodes: Iterable[Episode | Any]) -> list[Episode]:
    """The batch's turns, each checked by the input rule; the first bad one refuses the batch
    (``InvalidInputError`` naming ``episodes[k].<field>``), as does a batch too large."""
    if isinstance(episodes, str | bytes | dict | BaseModel) or not isinstance(episodes, Iterable):
        raise InvalidInputError("episodes", "must be a list of episodes")
    items = list(episodes)
    if len(items) > MAX_REMEMBER_BATCH:
        raise BatchTooLargeError(
            f"episodes: {len(items)} turns in one batch; the most is {MAX_REMEMBER_BATCH}"
            " (MAX_REMEMBER_BATCH): send smaller batches"
        )
    batch = []
    for k, item in enumerate(items):
        try:
            batch.append(check_episode(as_episode(item)))
        except InvalidInputError as exc:
            raise InvalidInputError(f"episodes[{k}].{exc.field}", exc.problem) from exc
        except ValueError as exc:
            raise InvalidInputError(f"episodes[{k}]", str(exc).splitlines()[0]) from exc
    return batch


def distinct(batch: list[Episode]) -> list[Episode]:
    """The batch without repeats: the same user's id twice with the same content is one turn,
    with other content an ``EpisodeConflictError`` naming both indexes."""
    first: dict[tuple[str | None, str], int] = {}
    out: list[Episode] = []
    for k, episode in enumerate(batch):
        seen = first.get(turns.turn_key(episode))
        if seen is None:
            first[turns.turn_key(episode)] = k
            out.append(episode)
        elif turns.same_content(batch[seen], episode):
            continue
        else:
            raise turns.EpisodeConflictError(
                f"episodes[{k}]: episode {episode.id!r} is also episodes[{seen}] with other"
                " content; an episode is immutable: give each turn its own id"
            )
    return out
