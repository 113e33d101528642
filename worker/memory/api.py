"""``WorkingMemory``: one session's variables, task state, scratchpad and checkpoints.

It reads and writes the very keys the lifecycle worker mutates (``SessionKeys``), through the
same Lua prelude, so a pause, resume or terminate issued on the streams and a ``set`` made
here see one consistent session. Names and values are checked here, before anything is sent;
what must be atomic with the write (limits, expiry, the terminated check) happens in the
backend, in Redis inside the script.

Names, argument order and returned shapes are those of the syndarix / LoomFlow working memory
(``for_session(session_id, project_id, agent_instance_id)``, ``set(key, value,
ttl_seconds)``, dicts from ``list_checkpoints`` and ``get_stats``), so code written against
it runs unchanged.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self, get_args

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from schemas.inputs import InvalidInputError, check_ttl, text_problem
from worker.codec import json_bytes
from worker.connections import AnyRedis, client_for
from worker.ids import InvalidIdError, id_text, validate_id, write_id_text
from worker.keys import SessionKeys
from worker.logs import get_logger
from worker.memory.backend import JsonMember, MemoryBackend
from worker.memory.errors import (
    InvalidKeyError,
    InvalidValueError,
    LimitExceededError,
    ReservedKeyError,
    UnstorableTextError,
)
from worker.memory.inmemory_backend import InMemoryBackend
from worker.memory.models import (
    CheckpointInfo,
    MemoryStats,
    ScratchpadEntry,
    TaskState,
    TaskStatus,
    clamp_progress,
    rfc3339,
    utc_now,
)
from worker.memory.redis_backend import RedisBackend, describe_url
from worker.settings import Settings, get_settings

log = get_logger(__name__)

MAX_KEY_LENGTH = 256
RESERVED_PREFIX = "_"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_STATUSES = frozenset(get_args(TaskStatus))

Ttl = float | timedelta
AnyId = str | uuid.UUID


def validate_key(key: str) -> str:
    """Return ``key`` if it may name a variable, else raise why not."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(f"a key must be a non-empty string; got {key!r:.80}")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            f"key {key[:40]!r}… is {len(key)} characters; the maximum is {MAX_KEY_LENGTH}"
        )
    if _CONTROL.search(key):
        raise InvalidKeyError(f"key {key!r:.80} contains control characters")
    if text_problem(key, MAX_KEY_LENGTH * 4) is not None:
        raise InvalidKeyError(f"key {key!r:.80} is not Unicode text (a lone surrogate)")
    if key.startswith(RESERVED_PREFIX):
        raise ReservedKeyError(
            f"key {key!r:.80} starts with {RESERVED_PREFIX!r}; those names are reserved for "
            "the worker, choose another"
        )
    return key


def _ttl_ms(ttl: Ttl | None) -> int | None:
    if ttl is None:
        return None
    seconds = check_ttl(ttl.total_seconds() if isinstance(ttl, timedelta) else ttl)
    return max(1, round(seconds * 1000))


class WorkingMemory:
    """The working memory of one session. Every method is one round trip to Redis."""

    def __init__(
        self,
        backend: MemoryBackend,
        *,
        project_id: str,
        session_id: str,
        settings: Settings,
        agent_instance_id: str | None = None,
        using_fallback: bool = False,
    ) -> None:
        self.backend = backend
        self.agent_instance_id = agent_instance_id
        self.project_id = project_id
        self.session_id = session_id
        self.settings = settings
        self._using_fallback = using_fallback

    @classmethod
    async def for_session(
        cls,
        session_id: AnyId,
        project_id: AnyId | None = None,
        agent_instance_id: AnyId | None = None,
        *,
        redis: AnyRedis | None = None,
        settings: Settings | None = None,
        fallback_to_memory: bool | None = None,
    ) -> WorkingMemory:
        """Open a session's working memory in Redis.

        Ids may be strings or ``uuid.UUID``; without ``project_id`` the session belongs to
        the project ``default_project`` (``MEMWORKER_DEFAULT_PROJECT``). Without ``redis``, a
        client for ``settings.redis_url`` is created and closed by :meth:`close`; a client
        passed in stays the caller's.

        ``fallback_to_memory`` (default: ``memory_fallback``, ``MEMWORKER_MEMORY_FALLBACK``)
        opts in to the seeds' graceful fallback: Redis is pinged now, and if it cannot be
        reached the session lives in this process's memory only (``is_using_fallback`` is
        true, a warning is logged); it stays there, it never moves back to Redis. Without the
        opt-in nothing is sent now, and an unreachable Redis raises ``RedisUnavailableError``
        from the first call.
        """
        settings = settings or get_settings()
        project, session = _scope(settings, project_id, session_id)
        agent = (
            None if agent_instance_id is None else id_text(agent_instance_id, "agent_instance_id")
        )
        keys = SessionKeys.for_session(settings.stream_prefix, settings.shards, project, session)
        owns = redis is None
        client = redis if redis is not None else client_for(settings)
        backend: MemoryBackend = RedisBackend(client, keys, settings, owns_client=owns)
        fallback = settings.memory_fallback if fallback_to_memory is None else fallback_to_memory
        if fallback and (reason := await _unreachable(client)) is not None:
            where = describe_url(client)
            if owns:
                await client.aclose()
            log.warning(
                "working_memory_fallback",
                project_id=project,
                session_id=session,
                redis=where,
                reason=reason,
                detail="Redis cannot be reached: this session's working memory lives in this "
                "process only, is lost when it exits, and is not seen by the lifecycle worker",
            )
            backend = InMemoryBackend(project, session, settings)
        return cls(
            backend,
            project_id=project,
            session_id=session,
            settings=settings,
            agent_instance_id=agent,
            using_fallback=isinstance(backend, InMemoryBackend),
        )

    @classmethod
    def in_memory(
        cls,
        session_id: AnyId,
        project_id: AnyId | None = None,
        *,
        settings: Settings | None = None,
    ) -> WorkingMemory:
        """Working memory held in this process only, for tests; see also ``fallback_to_memory``."""
        settings = settings or get_settings()
        project, session = _scope(settings, project_id, session_id)
        backend = InMemoryBackend(project, session, settings)
        return cls(backend, project_id=project, session_id=session, settings=settings)

    @property
    def is_using_fallback(self) -> bool:
        """Whether this session fell back to process memory at open (see ``for_session``)."""
        return self._using_fallback

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # Encoding.

    def _encode(self, value: Any, what: str) -> bytes:
        try:
            text = json_bytes(value, what)
        except InvalidInputError as exc:
            raise UnstorableTextError(str(exc)) from exc
        except (TypeError, ValueError) as exc:
            raise InvalidValueError(str(exc)) from exc
        limit = self.settings.max_value_bytes
        if len(text) > limit:
            raise LimitExceededError(
                f"{what} is {len(text)} bytes as JSON; the maximum is {limit} "
                "(max_value_bytes, MEMWORKER_MAX_VALUE_BYTES)",
                limit="value_bytes",
                setting="max_value_bytes",
                maximum=limit,
            )
        return text

    # Variables.

    async def set(self, key: str, value: Any, ttl_seconds: Ttl | None = None) -> None:
        """Store ``value`` (any JSON value) under ``key``.

        ``ttl_seconds`` (a number or a ``timedelta``) makes the key alone expire; it defaults
        to ``default_key_ttl_seconds`` (none: the key lives as long as the session).
        """
        validate_key(key)
        text = self._encode(value, f"the value of key {key!r:.80}")
        default = self.settings.default_key_ttl_seconds
        ttl_ms = _ttl_ms(ttl_seconds if ttl_seconds is not None else default)
        await self.backend.set(key, text, ttl_ms)

    async def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (decoded from JSON), or ``default`` when it is not set."""
        found = await self.backend.get(validate_key(key))
        return default if found is None else orjson.loads(found)

    async def delete(self, key: str) -> bool:
        """Remove ``key``; whether it was there."""
        return await self.backend.delete(validate_key(key))

    async def exists(self, key: str) -> bool:
        """Whether ``key`` is set in this session."""
        return await self.backend.exists(validate_key(key))

    async def list_keys(self, pattern: str = "*") -> list[str]:
        """Names of this session's keys matching a Redis glob, sorted.

        The glob runs over names inside the session only (``*``, ``?``, ``[...]``; escape a
        literal with ``\\`` or ``worker.keys.escape_glob``), so no pattern reaches another
        session or project.
        """
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a string; got {pattern!r:.80}")
        return sorted(await self.backend.list_keys(pattern))

    async def get_all(self) -> dict[str, Any]:
        """Every live key and its value, read in one call."""
        result: dict[str, Any] = orjson.loads(await self.backend.get_all())
        return result

    async def clear(self) -> int:
        """Remove the keys, task state and scratchpad (checkpoints stay); items removed."""
        return await self.backend.clear()

    # Task state.

    async def set_task_state(
        self,
        state: TaskState | None = None,
        *,
        description: str = "",
        current_step: int = 0,
        total_steps: int = 0,
        status: TaskStatus = "pending",
        progress_percent: float = 0.0,
        data: Mapping[str, Any] | None = None,
    ) -> TaskState:
        """Replace the task state, given as a ``TaskState`` or as its fields."""
        now = utc_now()
        if state is None:
            state = TaskState(
                description=description,
                current_step=current_step,
                total_steps=total_steps,
                status=status,
                progress_percent=progress_percent,
                started_at=now,
                updated_at=now,
                data=dict(data or {}),
            )
        else:
            state = state.model_copy(update={"updated_at": now})
        text = self._encode(state.model_dump(mode="json"), "the task state")
        await self.backend.set_task(text)
        return state

    async def get_task_state(self) -> TaskState | None:
        """The session's task state, or None when none was set."""
        found = await self.backend.get_task()
        return None if found is None else TaskState.model_validate_json(found)

    async def update_task_progress(
        self,
        current_step: int | None = None,
        progress_percent: float | None = None,
        status: TaskStatus | None = None,
        *,
        total_steps: int | None = None,
        description: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> TaskState:
        """Change the named fields of the task state in place; the task state after.

        A session without a task state gets one: ``TaskState``'s defaults with the fields
        given (``started_at`` now), so progress reported before any ``set_task_state`` is
        never lost. ``progress_percent`` is clamped to 0-100; ``data`` is merged into the
        task's data (keys given replace, others stay); ``updated_at`` is set to now.
        """
        now = utc_now()
        fields: list[JsonMember] = []
        if current_step is not None:
            fields.append(("current_step", self._encode(_count(current_step, "current_step"), "")))
        if total_steps is not None:
            fields.append(("total_steps", self._encode(_count(total_steps, "total_steps"), "")))
        if progress_percent is not None:
            fields.append(("progress_percent", orjson.dumps(clamp_progress(progress_percent))))
        if status is not None:
            if status not in _STATUSES:
                raise ValueError(f"status must be one of {sorted(_STATUSES)}; got {status!r}")
            fields.append(("status", orjson.dumps(status)))
        if description is not None:
            fields.append(("description", self._encode(description, "the task description")))
        fields.append(("updated_at", orjson.dumps(rfc3339(now))))
        members = [
            (str(name), self._encode(value, f"task data {name!r:.80}"))
            for name, value in (data or {}).items()
        ]
        fresh = orjson.dumps(TaskState(started_at=now, updated_at=now).model_dump(mode="json"))
        return TaskState.model_validate_json(await self.backend.update_task(fields, members, fresh))

    # Scratchpad.

    async def append_scratchpad(self, content: Any) -> int:
        """Append a note (any JSON value); the number of entries after (bounded by
        ``max_scratchpad_entries``, the oldest dropped first)."""
        self._encode(content, "the scratchpad entry")
        entry = self._encode({"content": content, "timestamp": rfc3339(utc_now())}, "")
        return await self.backend.append_scratchpad(entry)

    async def _entries(self, limit: int | None) -> list[ScratchpadEntry]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be None or >= 0; got {limit}")
        if limit == 0:
            return []
        entries: list[ScratchpadEntry] = [
            orjson.loads(entry) for entry in await self.backend.get_scratchpad(limit)
        ]
        return entries

    async def get_scratchpad(self, limit: int | None = None) -> list[Any]:
        """The contents of the newest ``limit`` entries (all when ``None``), oldest first."""
        return [entry["content"] for entry in await self._entries(limit)]

    async def get_scratchpad_with_timestamps(
        self, limit: int | None = None
    ) -> list[ScratchpadEntry]:
        """The newest ``limit`` entries as ``{"content", "timestamp"}`` (RFC 3339, UTC),
        oldest first."""
        return await self._entries(limit)

    async def clear_scratchpad(self) -> int:
        """Empty the scratchpad; how many entries it held."""
        return await self.backend.clear_scratchpad()

    # Checkpoints.

    async def create_checkpoint(
        self, description: str = "", checkpoint_id: str | None = None
    ) -> str:
        """Save keys, task state and scratchpad server-side; the checkpoint's id.

        Without ``checkpoint_id`` a UUID4 is generated; an existing id is replaced.
        """
        if checkpoint_id is None:
            checkpoint_id = str(uuid.uuid4())
        else:
            _checkpoint_id(checkpoint_id)
        if not isinstance(description, str):
            raise TypeError(f"description must be a string; got {description!r:.80}")
        await self.backend.create_checkpoint(checkpoint_id, description, rfc3339(utc_now()))
        return checkpoint_id

    async def restore_checkpoint(self, checkpoint_id: str, clear_current: bool = True) -> int:
        """Bring a checkpoint back; the number of items afterwards. An unknown id raises
        ``CheckpointNotFoundError``, a ``MemoryNotFoundError``.

        With ``clear_current`` the current keys, task state and scratchpad are replaced;
        without, the checkpoint's keys are written over the current ones (others kept), its
        task state replaces the current one if it has one, and the scratchpad is kept.
        """
        return await self.backend.restore_checkpoint(_checkpoint_id(checkpoint_id), clear_current)

    async def list_checkpoints(self) -> list[CheckpointInfo]:
        """The session's checkpoints, oldest first: dicts with ``id`` (also as
        ``checkpoint_id``, the name every other place uses), ``description``,
        ``created_at`` (RFC 3339, UTC) and ``items``."""
        listed: list[CheckpointInfo] = []
        for raw in await self.backend.list_checkpoints():
            info = orjson.loads(raw)
            listed.append(
                {
                    "id": info["checkpoint_id"],
                    "checkpoint_id": info["checkpoint_id"],
                    "description": info.get("description") or "",
                    "created_at": info["created_at"],
                    "items": int(info.get("items", 0)),
                }
            )
        # The store orders by millisecond; two made in the same one are ordered by the
        # microseconds of created_at (a stable sort keeps the store's order on a tie).
        listed.reverse()
        listed.sort(key=lambda c: datetime.fromisoformat(c["created_at"]))
        return listed

    async def delete_checkpoint(self, checkpoint_id: str) -> bool:
        """Delete one checkpoint; whether it existed."""
        return await self.backend.delete_checkpoint(_checkpoint_id(checkpoint_id))

    # Operations.

    async def get_stats(self) -> MemoryStats:
        """What the session holds, under the seeds' keys plus ours (see ``MemoryStats``)."""
        raw = await self.backend.stats()
        return {
            "scope_type": "session",
            "scope_id": self.session_id,
            "using_fallback": self._using_fallback,
            "total_keys": raw.keys + raw.has_task + (raw.scratchpad_entries > 0) + raw.checkpoints,
            "user_keys": raw.keys,
            "checkpoint_count": raw.checkpoints,
            "scratchpad_entries": raw.scratchpad_entries,
            "has_task_state": raw.has_task,
            "project_id": self.project_id,
            "session_id": self.session_id,
            "agent_instance_id": self.agent_instance_id,
            "backend": "redis" if isinstance(self.backend, RedisBackend) else "memory",
            "state": raw.state,
            "approximate_bytes": raw.approximate_bytes,
            "ttl_seconds": None if raw.ttl_ms is None else raw.ttl_ms / 1000,
        }

    async def is_healthy(self) -> bool:
        """Whether the store answers (never raises)."""
        return await self.backend.ping()

    async def close(self) -> None:
        """Release the Redis client if this object created it."""
        await self.backend.close()


def _count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0; got {value!r}")
    return value


def _scope(settings: Settings, project_id: AnyId | None, session_id: AnyId) -> tuple[str, str]:
    """The (project, session) ids as text; no project is the configured default project."""
    if project_id is None:
        return settings.default_project, write_id_text(session_id, "session_id")
    return write_id_text(project_id, "project_id"), write_id_text(session_id, "session_id")


async def _unreachable(client: AnyRedis) -> str | None:
    """Why ``client``'s server cannot be reached, or ``None`` when it answers a PING."""
    try:
        await client.ping()  # type: ignore[misc]
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        return str(exc) or type(exc).__name__
    return None


def _checkpoint_id(checkpoint_id: str) -> str:
    try:
        return validate_id(checkpoint_id, "checkpoint_id")
    except InvalidIdError as exc:
        raise InvalidKeyError(str(exc)) from None
