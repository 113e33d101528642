"""The storage interface both backends satisfy.

A backend stores JSON text under names and enforces what must be atomic with the write: the
key, scratchpad and checkpoint limits, per-key and idle expiry, and the refusal to write to a
terminated session. Validation of names and values, encoding and models live in ``api.py``, so
the two backends cannot drift apart on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# A member of a JSON object: (name, JSON text of the value).
JsonMember = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class RawStats:
    state: str | None
    keys: int
    scratchpad_entries: int
    checkpoints: int
    has_task: bool
    approximate_bytes: int
    ttl_ms: int | None


class MemoryBackend(Protocol):
    """One session's storage. Every method is one round trip to the store."""

    async def set(self, name: str, value: bytes, ttl_ms: int | None) -> None: ...

    async def get(self, name: str) -> bytes | None: ...

    async def delete(self, name: str) -> bool: ...

    async def exists(self, name: str) -> bool: ...

    async def list_keys(self, pattern: str) -> list[str]:
        """Names matching a Redis-style glob, among this session's variables only."""
        ...

    async def get_all(self) -> bytes:
        """Every live variable as one JSON object."""
        ...

    async def clear(self) -> int:
        """Drop variables, task state and scratchpad (not checkpoints); items dropped."""
        ...

    async def set_task(self, task: bytes) -> None: ...

    async def get_task(self) -> bytes | None: ...

    async def update_task(
        self, fields: Sequence[JsonMember], data: Sequence[JsonMember], fresh: bytes
    ) -> bytes:
        """Overwrite top-level ``fields`` and members of ``data`` of the task state, starting
        from ``fresh`` when the session has none; the task state after."""
        ...

    async def append_scratchpad(self, entry: bytes) -> int:
        """Append, dropping the oldest beyond the bound; the number of entries after."""
        ...

    async def get_scratchpad(self, limit: int | None) -> list[bytes]:
        """The newest ``limit`` entries (all when ``None``), oldest first."""
        ...

    async def clear_scratchpad(self) -> int: ...

    async def create_checkpoint(self, checkpoint_id: str, description: str, now: str) -> int:
        """Save the session under ``checkpoint_id``; the number of items saved."""
        ...

    async def restore_checkpoint(self, checkpoint_id: str, clear_current: bool) -> int:
        """Restore; the number of items afterwards. Unknown id: CheckpointNotFoundError."""
        ...

    async def list_checkpoints(self) -> list[bytes]:
        """Checkpoint info JSON, newest first."""
        ...

    async def delete_checkpoint(self, checkpoint_id: str) -> bool: ...

    async def stats(self) -> RawStats: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
