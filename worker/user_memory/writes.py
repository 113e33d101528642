"""Writing turns: ``Memory.remember`` and ``Memory.remember_many`` (``TurnWriter``).

A call is one transaction of one statement (``turns.insert_turns``: the rows and their owed
``episode.remembered`` events), then one group-committed publish shared with the calls that
came meanwhile (``worker.episodes.changes.OwedPublisher``: the events on the change feed and
the turns' ``episode.recorded`` on ``P:episodes`` in one Redis pipeline, marked in one
transaction). So a call costs two transactions and, under load, a share of a pipeline, and
concurrent agents of a project no longer queue one by one behind its outbox lock.

**Batches.** ``remember_many(episodes)`` stores up to ``MAX_REMEMBER_BATCH`` turns in one
round trip. A batch is refused whole, nothing stored: a bad item raises the input rule's
``InvalidInputError`` naming ``episodes[k].<field>``, a conflicting id ``EpisodeConflictError``
naming ``episodes[k]``, too many items ``BatchTooLargeError`` naming the limit. The same id
twice in a batch with the same content is one turn.

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

    async def remember(self, episode: Episode | Any) -> str:
        episode = check_episode(as_episode(episode))
        await self._store([episode])
        return episode.id

    async def remember_many(self, episodes: Iterable[Episode | Any]) -> list[str]:
        batch = checked_batch(episodes)
        await self._store(distinct(batch))
        return [episode.id for episode in batch]

    async def _store(self, episodes: list[Episode]) -> None:
        if not episodes:
            return
        events = [
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
        async with self.publisher.engine.begin() as conn:
            stored = await turns.insert_turns(conn, self.project_id, episodes, events)
        await asyncio.gather(
            *(
                self.vectors.remembered(str(turns.turn_uuid(self.project_id, episode.id)))
                for episode, (new, _owed) in zip(episodes, stored, strict=True)
                if new
            )
        )
        owed = [
            self._announcement(episode)
            for episode, (_new, owed) in zip(episodes, stored, strict=True)
            if owed
        ]
        try:
            await self.publisher.flush(owed)
        except Exception as exc:  # stored: the events stay owed to the next publish
            log.warning("change feed: events stay owed", error=str(exc).splitlines()[:1])

    def _announcement(self, episode: Episode) -> tuple[Any, bytes]:
        row_id = turns.turn_uuid(self.project_id, episode.id)
        source = f"{turns.TURN_SOURCE_PREFIX}{self.project_id}/{episode.id}"
        return row_id, Announcement(row_id, self.project_id, episode.session_id, source).wire()


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
    """The batch without repeats: the same id twice with the same content is one turn, with
    other content an ``EpisodeConflictError`` naming both indexes."""
    first: dict[str, int] = {}
    out: list[Episode] = []
    for k, episode in enumerate(batch):
        seen = first.get(episode.id)
        if seen is None:
            first[episode.id] = k
            out.append(episode)
        elif turns.same_content(batch[seen], episode):
            continue
        else:
            raise turns.EpisodeConflictError(
                f"episodes[{k}]: episode {episode.id!r} is also episodes[{seen}] with other"
                " content; an episode is immutable: give each turn its own id"
            )
    return out
