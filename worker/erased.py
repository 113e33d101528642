"""The erasure record in Redis (``P:erased``): what ``forget`` covered, for readers of streams.

``memworker forget`` writes each erasure twice: a row of the Postgres table ``erasures`` (the
durable record: ``worker.db.models.Erasure``) and a field of the hash ``P:erased``: ``project``
or ``project/session`` → the cutoff in ms (the latest forget's; a later one covers more). Ids
and times only. The paths that read streams and may lack Postgres (the replay of commands, the
DLQ's redrive) check this hash; the consolidator checks the table. An entry is covered when its
project (and session, for a session's erasure) match and it is older than the cutoff: the time
its stream id says, or the result's ``occurred_at``.

``entry_scope`` also tells forget which stream entries carry a project: a command, a result or
an announcement (its ``data``), or a dead letter of any of them (the original entry's fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from worker.codec import UnusableEntryError, decode_entry, text
from worker.keys import erased_key


def entry_scope(fields: Mapping[Any, Any]) -> tuple[str | None, str | None]:
    """``(project_id, session_id)`` an entry carries (None when it carries none); a dead
    letter's are its original entry's."""
    try:
        body = decode_entry(fields)
    except (UnusableEntryError, ValueError):
        return None, None
    if "source_stream" in fields or b"source_stream" in fields:  # a dead letter
        try:
            body = decode_entry(body)
        except (UnusableEntryError, ValueError):
            return None, None
    project, session = body.get("project_id"), body.get("session_id")
    return (
        project if isinstance(project, str) else None,
        session if isinstance(session, str) else None,
    )


def entry_ms(entry_id: str | bytes) -> int:
    """The millisecond a stream id says its entry was added."""
    return int(text(entry_id).partition("-")[0])


@dataclass(slots=True)
class ErasedIndex:
    """``P:erased`` as read once: cutoffs (ms) by project and by ``project/session``."""

    cutoffs: dict[str, int] = field(default_factory=dict)

    def covers(self, project: str | None, session: str | None, at_ms: int) -> bool:
        """True when a forget covered data of ``project``/``session`` from ``at_ms``."""
        if project is None:
            return False
        cutoff = self.cutoffs.get(project)
        if cutoff is not None and at_ms < cutoff:
            return True
        if session is None:
            return False
        cutoff = self.cutoffs.get(f"{project}/{session}")
        return cutoff is not None and at_ms < cutoff

    def covers_entry(self, entry_id: str | bytes, fields: Mapping[Any, Any]) -> bool:
        """True when a forget covered this stream entry (a dead letter: by its source id)."""
        if not self.cutoffs:
            return False
        project, session = entry_scope(fields)
        source = fields.get("source_id", fields.get(b"source_id"))
        at = entry_ms(source) if source else entry_ms(entry_id)
        return self.covers(project, session, at)


async def load_erased(redis: Redis, prefix: str) -> ErasedIndex:
    """The record as it is now."""
    raw: Any = await redis.hgetall(erased_key(prefix))
    return ErasedIndex({text(k): int(v) for k, v in raw.items()})


async def record_erased(
    redis: Redis, prefix: str, project_id: str, session_id: str | None, cutoff_ms: int
) -> None:
    """Add one erasure to ``P:erased`` (keeping the later cutoff of a scope forgotten twice)."""
    scope = project_id if session_id is None else f"{project_id}/{session_id}"
    key = erased_key(prefix)
    known = await redis.hget(key, scope)
    if known is None or int(known) < cutoff_ms:
        await redis.hset(key, scope, str(cutoff_ms))
