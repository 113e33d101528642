"""``Access``: what a server is configured to reach (one project, optionally one user) and the
connections its calls share; ``failure``: how any error becomes a status and one line.

The project comes from the server's configuration only. A server pinned to a user
(``--user`` or ``MEMWORKER_API_USER``) serves that user's memory alone: a call naming another
user is refused, so nothing is read from or written into another user's memory. A server not
pinned takes the user from each call (none: the anonymous bucket, as ``worker.Memory``).
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

from pydantic import ValidationError
from sqlalchemy import text

from schemas.inputs import InvalidInputError
from worker.connections import AnyRedis, client_for
from worker.db.engine import create_database_engine
from worker.erasure.forget import ForgetIncompleteError
from worker.errors import ActionableError, one_line
from worker.ids import validate_id, validate_write_id
from worker.keys import SessionKeys
from worker.memory import (
    LimitExceededError,
    MemoryNotFoundError,
    RedisUnavailableError,
    SessionPausedError,
    SessionTerminatedError,
    WorkingMemory,
)
from worker.settings import Settings
from worker.user_memory.blocks import BlockTooLargeError
from worker.user_memory.memory import Memory
from worker.user_memory.models import IsolationWarning
from worker.user_memory.turns import EpisodeConflictError
from worker.user_memory.writes import BatchTooLargeError

READY_SECONDS = 5.0
"""How long ``/readyz`` waits for Postgres, and for Redis past ``MEMWORKER_REDIS_RETRY_SECONDS``
(a refused connection is retried that long, then named), before it answers 503 naming it."""


class AccessError(ActionableError):
    """A call refused as it stands: its message is the one line to show, ``status`` the HTTP
    status it maps to (400 bad input, 403 another user's memory, 404 not found)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Access:
    """One server's scope and connections: ``project_id`` (from configuration), ``user_id``
    (the pinned user, or None: each call names its own), a pooled Postgres engine and one Redis
    client shared by every call. ``close()`` closes them."""

    def __init__(self, settings: Settings, project_id: str, user_id: str | None = None) -> None:
        self.settings = settings
        # Calls write under them: the write rule ("..", which a link drops, is refused).
        self.project_id = validate_write_id(project_id, "project_id")
        self.user_id = None if user_id is None else validate_write_id(user_id, "user_id")
        self.engine = create_database_engine(settings.database_url)
        self.redis: AnyRedis = client_for(settings)
        self.memory = Memory(
            self.project_id, settings=settings, engine=self.engine, redis=self.redis
        )
        # The anonymous bucket is the documented meaning of a call without a user: no warning.
        warnings.filterwarnings("ignore", category=IsolationWarning)

    async def close(self) -> None:
        await self.memory.close()
        await self.redis.aclose()
        await self.engine.dispose()

    def user(self, asked: str | None) -> str | None:
        """The user a call reaches: the pinned one (a call may repeat it, never name another),
        or the call's own (None: the anonymous bucket)."""
        if self.user_id is None or asked is None or asked == self.user_id:
            return self.user_id if self.user_id is not None else asked
        raise AccessError(
            f"this server serves user {self.user_id} only: a call may not name user {asked}",
            403,
        )

    async def working_memory(self, session_id: str) -> WorkingMemory:
        """The live session's working memory: a session a spawn created (else 404
        ``unknown_session``: a door never creates one, unlike ``WorkingMemory`` in Python); on
        a pinned server only a session whose spawn named the pinned user (else 403)."""
        session_id = validate_id(session_id, "session_id")
        keys = SessionKeys.for_session(
            self.settings.stream_prefix, self.settings.shards, self.project_id, session_id
        )
        state, owner = await self.redis.hmget(keys.meta, ["state", "user_id"])  # type: ignore[misc]
        if self.user_id is not None and (
            state is None or owner is None or _text(owner) != self.user_id
        ):  # the same answer for another user's session and none: no oracle of ids
            raise AccessError(
                f"session {session_id} of project {self.project_id} is not user "
                f"{self.user_id}'s (no session, live or terminated, spawned for that "
                "user has this id; a forgotten one keeps no user)",
                403,
            )
        if state is None:  # never spawned (or gone): a door never creates a session
            raise AccessError(
                f"unknown_session: session_id {session_id} of project {self.project_id} is not "
                "a live session (no spawn of it was applied, or it has expired); spawn it first",
                404,
            )
        return await WorkingMemory.for_session(
            session_id, self.project_id, redis=self.redis, settings=self.settings
        )

    async def ready(self) -> str | None:
        """Why the servers cannot be reached (one line), or None when both answer; within
        ``READY_SECONDS`` each (Redis: plus its retry window), whatever a store does (a probe
        answers promptly: Sentinels that never answer were a /readyz with no answer at all)."""
        redis_s = READY_SECONDS + self.settings.redis_retry_seconds  # its retries said first
        checks = (
            ("Redis", self._redis_answers, redis_s),
            ("Postgres", self._postgres_answers, READY_SECONDS),
        )
        for name, check, seconds in checks:
            try:
                async with asyncio.timeout(seconds) as clock:
                    await check()
            except Exception as exc:
                if clock.expired():
                    return f"{name} did not answer within {seconds:g} s"
                return one_line(exc)
        return None

    async def _redis_answers(self) -> None:
        await self.redis.ping()  # type: ignore[misc]

    async def _postgres_answers(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def invalid_arguments(exc: ValidationError) -> str:
    """A validation error as one line: ``field: what is wrong`` for each problem."""
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "arguments"
        problems.append(f"{field}: {error['msg'].removeprefix('Value error, ')}")
    return "invalid arguments: " + "; ".join(problems)


def failure(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and the one line for a failed call (the CLI's line: what is wrong and,
    for a server that cannot be reached, what to do). Bad input is a 4xx, never a 500."""
    if isinstance(exc, AccessError):
        return exc.status, _first(exc)
    if isinstance(exc, ValidationError):
        return 422, invalid_arguments(exc)
    if isinstance(exc, LimitExceededError | BlockTooLargeError | BatchTooLargeError):
        return 413, _first(exc)
    if isinstance(exc, InvalidInputError):
        return 422, "invalid arguments: " + _first(exc)
    if (refused := _data_refused(exc)) is not None:
        return 422, refused
    if isinstance(exc, MemoryNotFoundError):
        return 404, _first(exc)
    if isinstance(exc, SessionTerminatedError | SessionPausedError | EpisodeConflictError):
        return 409, _first(exc)
    if isinstance(exc, RedisUnavailableError | ForgetIncompleteError):
        return 503, one_line(exc)  # a forget left owed: a retry finishes it
    if isinstance(exc, ValueError | TypeError | KeyError) and not _from_a_server(exc):
        return 400, _first(exc)
    message = one_line(exc)
    unreachable = message.startswith(("cannot reach", "Postgres", "Redis"))
    return (503 if unreachable else 500), message


def _first(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _data_refused(exc: BaseException) -> str | None:
    """Postgres refusing the data itself (SQLSTATE class 22, data exception; 54, a limit such
    as a tsvector past 1 MB): bad input the rule above did not catch, never an outage."""
    current: BaseException | None = exc
    for _ in range(5):
        if current is None:
            return None
        sqlstate = getattr(current, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate[:2] in {"22", "54"}:
            return f"invalid arguments: Postgres refused the data ({sqlstate}): {_first(current)}"
        current = getattr(current, "orig", None) or current.__cause__
    return None


def _from_a_server(exc: BaseException) -> bool:
    """A ValueError raised by a driver (Postgres, Redis) is the server's failure, not input."""
    module = type(exc).__module__.split(".")[0]
    return module in {"asyncpg", "sqlalchemy", "redis"}
