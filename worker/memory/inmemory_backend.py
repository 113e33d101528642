"""Working memory in this process, for fast tests without a server.

It mirrors the Redis backend's behaviour: per-key and idle expiry by a clock, the limits,
checkpoints, the scratchpad bound and Redis's glob dialect. It is only ever used when asked
for: ``WorkingMemory.in_memory``, or ``for_session(..., fallback_to_memory=True)`` when Redis
cannot be reached at open. A Redis outage never switches to it silently, because that forks
the session's state into one process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from worker.memory.backend import JsonMember, RawStats
from worker.memory.errors import (
    CheckpointNotFoundError,
    LimitExceededError,
    SessionBytesExceededError,
    SessionPausedError,
    SessionTerminatedError,
)
from worker.memory.patterns import glob_match
from worker.settings import Settings


def wall_clock_ms() -> float:
    return time.time() * 1000


@dataclass(slots=True)
class _Checkpoint:
    created_ms: float
    info: bytes
    vars: dict[str, bytes]
    vexp: dict[str, float]
    scratch: list[bytes]
    task: bytes | None


@dataclass(slots=True)
class _Session:
    vars: dict[str, bytes] = field(default_factory=dict)
    vexp: dict[str, float] = field(default_factory=dict)
    task: bytes | None = None
    scratch: list[bytes] = field(default_factory=list)
    checkpoints: dict[str, _Checkpoint] = field(default_factory=dict)


class InMemoryBackend:
    """One session's working memory in a dict. ``state`` plays the worker's ``meta`` state."""

    def __init__(
        self,
        project_id: str,
        session_id: str,
        settings: Settings,
        *,
        clock: Callable[[], float] = wall_clock_ms,
    ) -> None:
        self.state: str | None = None
        self._clock = clock
        self._data = _Session()
        self._expires_at: float | None = None
        self._session_ttl_ms = settings.session_ttl_seconds * 1000
        self._max_keys = settings.max_keys_per_session
        self._max_session_bytes = settings.max_session_bytes
        self._max_scratch = settings.max_scratchpad_entries
        self._max_checkpoints = settings.max_checkpoints_per_session
        self._where = f"session {project_id}/{session_id}"
        self._closed = False

    # The prelude's purge_expired, touch and session expiry.
    def _begin(self) -> float:
        now = self._clock()
        if self._expires_at is not None and now >= self._expires_at:
            self._data = _Session()
            self._expires_at = None
            self.state = None
        for name in [n for n, at in self._data.vexp.items() if at <= now]:
            del self._data.vexp[name]
            self._data.vars.pop(name, None)
        return now

    def _touch(self) -> None:
        if self.state == "terminated":
            return
        self._expires_at = None if self.state == "paused" else self._clock() + self._session_ttl_ms

    def _begin_write(self, *, paused_ok: bool = False) -> float:
        """A write begins: refused on a terminated session, and on a paused one unless it
        loses nothing there (a checkpoint made or deleted)."""
        now = self._begin()
        if self.state == "terminated":
            raise SessionTerminatedError(
                f"{self._where} is terminated; its working memory is read-only"
            )
        if self.state == "paused" and not paused_ok:
            raise SessionPausedError(
                f"{self._where} is paused; its working memory is read-only until it resumes "
                "(resume restores its checkpoint, so a write now would be lost): resume it first"
            )
        return now

    def _items(self) -> int:
        data = self._data
        return len(data.vars) + len(data.scratch) + (data.task is not None)

    async def set(self, name: str, value: bytes, ttl_ms: int | None) -> None:
        now = self._begin_write()
        data = self._data
        if name not in data.vars and len(data.vars) >= self._max_keys:
            raise LimitExceededError(
                f"{self._where} already holds {self._max_keys} keys, the maximum; delete some "
                "or raise max_keys_per_session (MEMWORKER_MAX_KEYS_PER_SESSION)",
                limit="keys",
                setting="max_keys_per_session",
                maximum=self._max_keys,
            )
        old = data.vars.get(name)
        grows = len(value) - (len(old) if old is not None else -len(name.encode()))
        if grows > 0:
            used = sum(len(n.encode()) + len(v) for n, v in data.vars.items())
            if used + grows > self._max_session_bytes:
                raise SessionBytesExceededError(
                    f"{self._where} would hold {used + grows:,} bytes of variables (it holds "
                    f"{used:,}), over the limit of {self._max_session_bytes:,}; delete some or "
                    "raise max_session_bytes (MEMWORKER_MAX_SESSION_BYTES)",
                    limit="session_bytes",
                    setting="max_session_bytes",
                    maximum=self._max_session_bytes,
                )
        data.vars[name] = value
        if ttl_ms:
            data.vexp[name] = now + ttl_ms
        else:
            data.vexp.pop(name, None)
        self._touch()

    async def get(self, name: str) -> bytes | None:
        self._begin()
        self._touch()
        return self._data.vars.get(name)

    async def delete(self, name: str) -> bool:
        self._begin_write()
        self._data.vexp.pop(name, None)
        found = self._data.vars.pop(name, None) is not None
        self._touch()
        return found

    async def exists(self, name: str) -> bool:
        self._begin()
        self._touch()
        return name in self._data.vars

    async def list_keys(self, pattern: str) -> list[str]:
        self._begin()
        self._touch()
        return [name for name in self._data.vars if glob_match(pattern, name)]

    async def get_all(self) -> bytes:
        self._begin()
        self._touch()
        return orjson.dumps({k: orjson.Fragment(v) for k, v in self._data.vars.items()})

    async def clear(self) -> int:
        self._begin_write()
        items = self._items()
        checkpoints = self._data.checkpoints
        self._data = _Session(checkpoints=checkpoints)
        self._touch()
        return items

    async def set_task(self, task: bytes) -> None:
        self._begin_write()
        self._data.task = task
        self._touch()

    async def get_task(self) -> bytes | None:
        self._begin()
        self._touch()
        return self._data.task

    async def update_task(
        self, fields: Sequence[JsonMember], data: Sequence[JsonMember], fresh: bytes
    ) -> bytes:
        self._begin_write()
        self._touch()
        task = orjson.loads(self._data.task if self._data.task is not None else fresh)
        task.update((name, orjson.loads(text)) for name, text in fields)
        if data:
            current = task.get("data")
            merged = dict(current) if isinstance(current, dict) else {}
            merged.update((name, orjson.loads(text)) for name, text in data)
            task["data"] = merged
        self._data.task = orjson.dumps(task)
        return self._data.task

    async def append_scratchpad(self, entry: bytes) -> int:
        self._begin_write()
        scratch = self._data.scratch
        scratch.append(entry)
        del scratch[: max(0, len(scratch) - self._max_scratch)]
        self._touch()
        return len(scratch)

    async def get_scratchpad(self, limit: int | None) -> list[bytes]:
        self._begin()
        self._touch()
        scratch = self._data.scratch
        return list(scratch[-limit:] if limit else scratch)

    async def clear_scratchpad(self) -> int:
        self._begin_write()
        removed = len(self._data.scratch)
        self._data.scratch = []
        self._touch()
        return removed

    async def create_checkpoint(self, checkpoint_id: str, description: str, now: str) -> int:
        now_ms = self._begin_write(paused_ok=True)
        data = self._data
        if checkpoint_id not in data.checkpoints and len(data.checkpoints) >= self._max_checkpoints:
            raise LimitExceededError(
                f"{self._where} already has {self._max_checkpoints} checkpoints, the maximum; "
                "delete some or raise max_checkpoints_per_session "
                "(MEMWORKER_MAX_CHECKPOINTS_PER_SESSION)",
                limit="checkpoints",
                setting="max_checkpoints_per_session",
                maximum=self._max_checkpoints,
            )
        items = self._items()
        info = {
            "checkpoint_id": checkpoint_id,
            "description": description,
            "created_at": now,
            "items": items,
        }
        data.checkpoints[checkpoint_id] = _Checkpoint(
            created_ms=now_ms,
            info=orjson.dumps(info),
            vars=dict(data.vars),
            vexp=dict(data.vexp),
            scratch=list(data.scratch),
            task=data.task,
        )
        self._touch()
        return items

    async def restore_checkpoint(self, checkpoint_id: str, clear_current: bool) -> int:
        self._begin_write()
        saved = self._data.checkpoints.get(checkpoint_id)
        if saved is None:
            raise CheckpointNotFoundError(
                f"{self._where} has no checkpoint {checkpoint_id!r}; list_checkpoints() shows "
                "the ones it has"
            )
        data = self._data
        if clear_current:
            data.vars = dict(saved.vars)
            data.vexp = dict(saved.vexp)
            data.scratch = list(saved.scratch)
            data.task = saved.task
        else:
            data.vars.update(saved.vars)
            for name in saved.vars:
                data.vexp.pop(name, None)
            data.vexp.update(saved.vexp)
            if saved.task is not None:
                data.task = saved.task
        self._begin()  # expiries saved in the checkpoint may have passed
        self._touch()
        return self._items()

    async def list_checkpoints(self) -> list[bytes]:
        self._begin()
        self._touch()
        newest_first = sorted(
            self._data.checkpoints.items(), key=lambda kv: (kv[1].created_ms, kv[0]), reverse=True
        )
        return [cp.info for _, cp in newest_first]

    async def delete_checkpoint(self, checkpoint_id: str) -> bool:
        self._begin_write(paused_ok=True)
        found = self._data.checkpoints.pop(checkpoint_id, None) is not None
        self._touch()
        return found

    async def stats(self) -> RawStats:
        self._begin()
        self._touch()
        data = self._data
        used = sum(len(k) + len(v) for k, v in data.vars.items())
        used += sum(len(e) for e in data.scratch) + len(data.task or b"")
        ttl = None if self._expires_at is None else max(0, int(self._expires_at - self._clock()))
        return RawStats(
            state=self.state,
            keys=len(data.vars),
            scratchpad_entries=len(data.scratch),
            checkpoints=len(data.checkpoints),
            has_task=data.task is not None,
            approximate_bytes=used,
            ttl_ms=ttl,
        )

    async def ping(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        self._closed = True
