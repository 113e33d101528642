"""Whose a stream entry of a session is (``worker.erasure.streams``): the lives of each
session id as the streams show them (``Lives``: a session id may be spawned again for another
user once its tombstone is gone) and a user's part of a scope (``UserScope``). docs/contract.md,
"Forgetting"."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from worker import codec
from worker.erasure.erased import letter_source_id, stream_id_parts, user_of

LIFE_STREAMS = (":lifecycle:{", ":results:{")
"""The streams whose entries a session's lives are told apart on: its shard's commands and
results (a dead letter is placed where its source entry was)."""


def life_position(
    stream: str, entry_id: Any, fields: dict[Any, Any], letter: bool
) -> tuple[str, int, int]:
    """Where an entry sits among its session's lives: its stream and id (a dead letter, an
    entry of a DLQ, ``letter``: its source entry's, when it names one)."""
    source_stream = fields.get(b"source_stream", fields.get("source_stream"))
    source = letter_source_id(fields) if letter else None
    if source_stream and source is not None:
        return codec.text(source_stream), *source
    return stream, *(stream_id_parts(entry_id) or (0, 0))


@dataclass(slots=True)
class Lives:
    """The lives of each session id as the streams show them (a session id may be spawned
    again, for another user, once its tombstone is gone): the spawn points of each session on
    each stream (a spawn command, an ``agent.spawned`` result: its id and its user, ``''`` for
    none), the user of each spawn by its ``event_id``, and the user each applied command's
    result names (by the command's ``event_id``)."""

    spawns: dict[tuple[str, str], list[tuple[int, int, str, str]]] = field(default_factory=dict)
    spawn_users: dict[str, str] = field(default_factory=dict)
    result_users: dict[str, str] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    """Spawns that started no life (their result: ``command.rejected``), by ``event_id``."""
    streams_of: dict[str, set[str]] = field(default_factory=dict)
    _sorted: dict[tuple[str, str], list[tuple[int, int, str, str]]] = field(default_factory=dict)

    def see(
        self,
        stream: str,
        entry_id: Any,
        fields: dict[Any, Any],
        body: dict[str, Any],
        letter: bool,
    ) -> None:
        """Note an entry of the project (``body``: its ``entry_body``; ``letter``: of a DLQ)."""
        session = body.get("session_id")
        if not isinstance(session, str):
            return
        user = body.get("user_id")
        user = user if isinstance(user, str) else ""
        kind = body.get("type")
        cause = body.get("causation_id")
        if kind in ("spawn", "agent.spawned"):
            spawn_id = body.get("event_id" if kind == "spawn" else "causation_id")
            spawn_id = spawn_id if isinstance(spawn_id, str) else ""
            at, ms, seq = life_position(stream, entry_id, fields, letter)
            if any(mark in at for mark in LIFE_STREAMS):
                self.spawns.setdefault((at, session), []).append((ms, seq, user, spawn_id))
                self.streams_of.setdefault(session, set()).add(at)
            if spawn_id:
                self.spawn_users[spawn_id] = user
        elif isinstance(cause, str):
            if user:
                self.result_users[cause] = user
            if kind == "command.rejected" and body.get("command") == "spawn":
                self.refused.add(cause)

    def _points(self, stream: str, session: str) -> list[tuple[int, int, str, str]]:
        """The session's spawns on the stream that started a life, in order (read once the
        first pass is over: sorted once)."""
        key = (stream, session)
        if key not in self._sorted:
            points = self.spawns.get(key, ())
            self._sorted[key] = sorted(p for p in points if p[3] not in self.refused)
        return self._sorted[key]

    def user_of_life(
        self, body: dict[str, Any], session: str, position: tuple[str, int, int]
    ) -> str | None:
        """The user of the life an entry that names no user belongs to (None: unknown): the
        spawn its ``spawn_event_id`` names; else the user its result named when it was
        applied; else, on its stream, the latest spawn of the session before it (none: the
        first after it, a command published ahead of its spawn); a refused spawn starts no
        life."""
        spawn_id = body.get("spawn_event_id")
        if isinstance(spawn_id, str) and spawn_id in self.spawn_users:
            return self.spawn_users[spawn_id]
        event_id = body.get("event_id")
        if "causation_id" not in body and event_id in self.result_users:
            return self.result_users[event_id]
        points = self._points(position[0], session)
        if not points:
            return None
        at = bisect_right(points, (position[1], position[2], "\U0010ffff", ""))
        return points[at - 1][2] if at else points[0][2]

    def holder(self, session: str) -> str | None:
        """The user of the session id's latest life the streams show (None: none shown)."""
        streams = self.streams_of.get(session, ())
        latest = max((p for at in streams for p in self._points(at, session)), default=None)
        return None if latest is None else latest[2]


@dataclass(frozen=True, slots=True)
class UserScope:
    """A user's part of a scope: the user (``''``: no user), the user's sessions, the ids
    of the user's deleted episodes (their announcements go too), and the sessions' lives
    (``Lives``: which life of a reused session id an entry that names no user is of)."""

    user: str
    sessions: Collection[str] = ()
    episode_ids: Collection[str] = ()
    lives: Lives = field(default_factory=Lives)

    def owns(
        self,
        body: dict[str, Any],
        session: str | None,
        position: tuple[str, int, int] | None = None,
    ) -> bool:
        """Whether the entry is the user's data. An entry that names a user is that user's
        only; an announcement of an episode is of the episode's user (``episode_ids``); an
        entry of a session that names no user (a later command, a rejection) is of the life of
        the session it belongs to (``Lives.user_of_life``), and, when no life is shown (its
        spawn trimmed), of the user's sessions' (``sessions``)."""
        if body.get("type") == "episode.recorded":
            return body.get("episode_id") in self.episode_ids
        named = body.get("user_id")
        if isinstance(named, str) and named:
            return named == self.user
        episode = body.get("episode_id")
        if isinstance(episode, str) and episode in self.episode_ids:
            return True
        life_entry = position is not None and any(m in position[0] for m in LIFE_STREAMS)
        if session is None or ("user_id" in body and not life_entry):
            return user_of(body) == self.user  # of no session, or a change-feed event
        if position is not None and life_entry:
            life = self.lives.user_of_life(body, session, position)
            if life is not None:
                return life == self.user
        return session in self.sessions or (self.user == "" and user_of(body) == "")

    def starts_session(self, body: dict[str, Any]) -> bool:
        """An entry that says its session is the user's: a spawn, or a result (the change
        feed's events name a turn's session: the caller's, not one of ours)."""
        if self.user:
            session_entry = "causation_id" in body or body.get("type") == "spawn"
            return session_entry and user_of(body) == self.user
        return user_of(body) == "" and body.get("type") in ("spawn", "agent.spawned")
