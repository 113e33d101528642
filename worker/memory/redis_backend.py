"""Working memory in Redis: one Lua script (``worker/lua/wm_*.lua``) per operation.

Each script shares the lifecycle worker's prelude, so per-key expiry, idle expiry (``touch``),
paused sessions and checkpoints behave exactly as the worker's own commands do, and each
operation is one atomic round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.connections import AnyRedis
from worker.keys import SessionKeys
from worker.memory.backend import JsonMember, RawStats
from worker.memory.errors import (
    CheckpointNotFoundError,
    LimitExceededError,
    RedisUnavailableError,
    SessionBytesExceededError,
    SessionForgottenError,
    SessionPausedError,
    SessionTerminatedError,
    WorkingMemoryError,
)
from worker.redis_conditions import ServerCondition, condition_error, server_condition
from worker.scripts import script
from worker.settings import Settings

Arg = str | int | float | bytes


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def describe_url(redis: AnyRedis) -> str:
    """The client's server as a URL, without credentials, for error messages."""
    pool = getattr(redis, "connection_pool", None)
    if pool is None:  # a RedisCluster: name the node it was started from
        nodes = redis.get_nodes() if hasattr(redis, "get_nodes") else []
        return ", ".join(f"redis://{n.host}:{n.port}" for n in nodes) or "redis cluster"
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


class RedisBackend:
    """One session's working memory in Redis, in the key layout of ``SessionKeys``."""

    def __init__(
        self, redis: AnyRedis, keys: SessionKeys, settings: Settings, *, owns_client: bool
    ) -> None:
        self.redis = redis
        self.keys = keys
        self._key_list = keys.all()
        self._max_session_bytes = settings.max_session_bytes
        self._session_ttl_ms = settings.session_ttl_seconds * 1000
        self._max_keys = settings.max_keys_per_session
        self._max_scratch = settings.max_scratchpad_entries
        self._max_checkpoints = settings.max_checkpoints_per_session
        self._owns_client = owns_client
        self._where = f"session {keys.project_id}/{keys.session_id}"

    async def _run(self, name: str, *args: Arg) -> Any:
        try:
            return await script(name)(self.redis, self._key_list, (self._session_ttl_ms, *args))
        except (RedisConnectionError, RedisTimeoutError, ResponseError) as exc:
            condition = server_condition(exc)
            if condition is None and isinstance(exc, ResponseError):
                self._raise_for(exc)
            where = f"Redis at {describe_url(self.redis)}"
            if condition is None or condition.kind == "unreachable":
                raise RedisUnavailableError(
                    f"{where} is unavailable ({exc}); "
                    "check that it is running and that REDIS_URL points at it",
                    condition,
                ) from exc
            error = await condition_error(self.redis, condition, where)
            raise RedisUnavailableError(str(error), condition) from exc

    def _raise_for(self, exc: ResponseError) -> NoReturn:
        code, _, detail = str(exc).partition(" ")
        if code == "WM_TERMINATED":
            raise SessionTerminatedError(
                f"{self._where} is terminated; its working memory is read-only"
            ) from None
        if code == "WM_FORGOTTEN":
            raise SessionForgottenError(
                f"{self._where} was forgotten (memworker forget); nothing may be written to it:"
                " use another session_id"
            ) from None
        if code == "WM_PAUSED":
            raise SessionPausedError(
                f"{self._where} is paused; its working memory is read-only until it resumes "
                "(resume restores its checkpoint, so a write now would be lost): resume it first"
            ) from None
        if code == "WM_LIMIT_KEYS":
            raise LimitExceededError(
                f"{self._where} already holds {detail} keys, the maximum; delete some or raise "
                "max_keys_per_session (MEMWORKER_MAX_KEYS_PER_SESSION)",
                limit="keys",
                setting="max_keys_per_session",
                maximum=int(detail),
            ) from None
        if code == "WM_LIMIT_BYTES":
            maximum, used, after = (int(n) for n in detail.split())
            raise SessionBytesExceededError(
                f"{self._where} would hold {after:,} bytes of variables (it holds {used:,}), "
                f"over the limit of {maximum:,}; delete some or raise max_session_bytes "
                "(MEMWORKER_MAX_SESSION_BYTES)",
                limit="session_bytes",
                setting="max_session_bytes",
                maximum=maximum,
            ) from None
        if code == "WM_NEARLY_FULL":
            condition = ServerCondition("nearly_full", detail)
            raise RedisUnavailableError(detail, condition) from None
        if code == "WM_LIMIT_CHECKPOINTS":
            raise LimitExceededError(
                f"{self._where} already has {detail} checkpoints, the maximum; delete some or "
                "raise max_checkpoints_per_session (MEMWORKER_MAX_CHECKPOINTS_PER_SESSION)",
                limit="checkpoints",
                setting="max_checkpoints_per_session",
                maximum=int(detail),
            ) from None
        if code == "WM_NO_CHECKPOINT":
            raise CheckpointNotFoundError(f"{self._where} has no such checkpoint") from None
        raise WorkingMemoryError(f"Redis refused a working-memory script: {exc}") from exc

    async def set(self, name: str, value: bytes, ttl_ms: int | None) -> None:
        await self._run(
            "wm_set.lua", name, value, ttl_ms or 0, self._max_keys, self._max_session_bytes
        )

    async def get(self, name: str) -> bytes | None:
        found = await self._run("wm_get.lua", name)
        return None if found is None else _bytes(found)

    async def delete(self, name: str) -> bool:
        return bool(await self._run("wm_delete.lua", name))

    async def exists(self, name: str) -> bool:
        return bool(await self._run("wm_exists.lua", name))

    async def list_keys(self, pattern: str) -> list[str]:
        names = await self._run("wm_list_keys.lua", pattern)
        return [_text(n) for n in names]

    async def get_all(self) -> bytes:
        return _bytes(await self._run("wm_get_all.lua"))

    async def clear(self) -> int:
        return int(await self._run("wm_clear.lua"))

    async def set_task(self, task: bytes) -> None:
        await self._run("wm_task_set.lua", task)

    async def get_task(self) -> bytes | None:
        found = await self._run("wm_task_get.lua")
        return None if found is None else _bytes(found)

    async def update_task(
        self, fields: Sequence[JsonMember], data: Sequence[JsonMember], fresh: bytes
    ) -> bytes:
        args: list[Arg] = [len(fields), fresh]
        for name, text in (*fields, *data):
            args += [name, text]
        return _bytes(await self._run("wm_task_update.lua", *args))

    async def append_scratchpad(self, entry: bytes) -> int:
        return int(await self._run("wm_scratch_append.lua", entry, self._max_scratch))

    async def get_scratchpad(self, limit: int | None) -> list[bytes]:
        entries = await self._run("wm_scratch_get.lua", limit or 0)
        return [_bytes(e) for e in entries]

    async def clear_scratchpad(self) -> int:
        return int(await self._run("wm_scratch_clear.lua"))

    async def create_checkpoint(self, checkpoint_id: str, description: str, now: str) -> int:
        return int(
            await self._run(
                "wm_checkpoint_create.lua", checkpoint_id, description, now, self._max_checkpoints
            )
        )

    async def restore_checkpoint(self, checkpoint_id: str, clear_current: bool) -> int:
        try:
            return int(
                await self._run("wm_checkpoint_restore.lua", checkpoint_id, int(clear_current))
            )
        except CheckpointNotFoundError:
            raise CheckpointNotFoundError(
                f"{self._where} has no checkpoint {checkpoint_id!r}; list_checkpoints() shows "
                "the ones it has"
            ) from None

    async def list_checkpoints(self) -> list[bytes]:
        return [_bytes(info) for info in await self._run("wm_checkpoint_list.lua")]

    async def delete_checkpoint(self, checkpoint_id: str) -> bool:
        return bool(await self._run("wm_checkpoint_delete.lua", checkpoint_id))

    async def stats(self) -> RawStats:
        state, keys, scratch, cps, task, used, ttl = await self._run("wm_stats.lua")
        return RawStats(
            state=_text(state) or None,
            keys=int(keys),
            scratchpad_entries=int(scratch),
            checkpoints=int(cps),
            has_task=bool(task),
            approximate_bytes=int(used),
            ttl_ms=int(ttl) if int(ttl) >= 0 else None,
        )

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())  # type: ignore[misc]
        except Exception:
            return False

    async def close(self) -> None:
        if self._owns_client:
            await self.redis.aclose()
