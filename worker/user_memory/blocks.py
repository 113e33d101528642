"""Pinned blocks: a user's always-in-context text, named, in pin order (``memory_blocks``).

Kept in Postgres, not Redis: a block must survive a Redis restart without persistence, and
every process must read what another wrote at once; an indexed read by primary key answers
well within the 2 ms ``working()`` budget (bench/user_memory.py), so a cache in Redis would be
one more copy to keep coherent and to forget, for nothing. Blocks cost Redis nothing but their
``block.updated`` events on the change feed.

Order (LoomFlow's): a new block takes the next pin slot (one past the highest the user has),
an update or append keeps its slot. Writes of one user are serialised by a transaction-scoped
advisory lock, so concurrent appends from any number of tasks or processes lose nothing and
two new blocks never share a slot. A block holds at most ``MEMWORKER_MAX_VALUE_BYTES`` (UTF-8):
a write past it is refused with a ``ValueError`` and changes nothing.
"""

from __future__ import annotations

import sys
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from schemas.inputs import InvalidInputError, check_id, check_text
from worker.episodes.changes import change_event, owe
from worker.ids import validate_write_id
from worker.user_memory.models import MemoryBlock, check_user_id

_LOCK = text(
    "SELECT pg_advisory_xact_lock(hashtextextended('memory_blocks/' || :p || '/' || :u, 0))"
)
_WRITE = """
INSERT INTO memory_blocks
    (project_id, user_key, name, content, pinned_order, updated_at, content_since)
SELECT :p, :u, :n, :c, (SELECT coalesce(max(pinned_order) + 1, 0) FROM memory_blocks
                        WHERE project_id = :p AND user_key = :u), clock.t, clock.t
FROM (SELECT clock_timestamp() AS t) AS clock
ON CONFLICT (project_id, user_key, name)
    DO UPDATE SET content = {content}, updated_at = EXCLUDED.updated_at,
                  content_since = {since}
    WHERE octet_length({content}) <= :max
RETURNING pinned_order, octet_length(content) AS size
"""
# A replace starts the block's text again (``content_since``: now); an append keeps its start,
# so a forget covering the old text still covers the block (``worker.erasure.users``).
_REPLACE = text(_WRITE.format(content="EXCLUDED.content", since="EXCLUDED.content_since"))
_APPEND = text(
    _WRITE.format(
        content="memory_blocks.content || EXCLUDED.content", since="memory_blocks.content_since"
    )
)
_READ = text(
    "SELECT name, content, updated_at, pinned_order FROM memory_blocks"
    " WHERE project_id = :p AND user_key = :u ORDER BY pinned_order, name"
)
_DELETE = text(
    "DELETE FROM memory_blocks WHERE project_id = :p AND user_key = :u"
    " AND (CAST(:before AS timestamptz) IS NULL OR content_since < :before) RETURNING name"
)


def user_key(user_id: str | None) -> str:
    """``memory_blocks.user_key``: the user id, '' for the anonymous bucket (a user id is never
    empty: ``check_user_id``)."""
    checked = check_user_id(user_id)
    return "" if checked is None else checked


class BlockTooLargeError(InvalidInputError):
    """A block write that would take the block past ``MEMWORKER_MAX_VALUE_BYTES``."""

    def __init__(self, message: str) -> None:
        super().__init__("content", message)


async def write_block(
    engine: AsyncEngine,
    project_id: str,
    user_id: str | None,
    name: str,
    content: str,
    *,
    append: bool,
    max_bytes: int,
) -> None:
    """Replace (or append to) a block, creating it in the next slot; one ``block.updated``.
    Its project and user by the write rule (``validate_write_id``)."""
    validate_write_id(project_id, "project_id")
    if user_id is not None:
        validate_write_id(user_id, "user_id")
    check_id(name, "name")
    if not isinstance(content, str):
        raise InvalidInputError("content", f"must be text, not {type(content).__name__}")
    check_text(content, "content", sys.maxsize)  # NUL, lone surrogates; the size below
    if len(content.encode()) > max_bytes:
        raise BlockTooLargeError(
            f"block {name!r} would hold more than {max_bytes} bytes (MEMWORKER_MAX_VALUE_BYTES)"
        )
    key = user_key(user_id)
    async with engine.begin() as conn:
        await conn.execute(_LOCK, {"p": project_id, "u": key})
        row = (
            await conn.execute(
                _APPEND if append else _REPLACE,
                {"p": project_id, "u": key, "n": name, "c": content, "max": max_bytes},
            )
        ).first()
        if row is None:
            raise BlockTooLargeError(
                f"appending to block {name!r} would take it past {max_bytes} bytes"
                " (MEMWORKER_MAX_VALUE_BYTES); nothing was changed"
            )
        await owe(
            conn,
            project_id,
            [
                change_event(
                    "block.updated",
                    project_id,
                    user_id,
                    f"{key}/{name}",
                    name=name,
                    pinned_order=row.pinned_order,
                    change="append" if append else "replace",
                    size=row.size,
                )
            ],
        )


async def read_blocks(
    conn: AsyncConnection, project_id: str, user_id: str | None
) -> list[MemoryBlock]:
    rows = await conn.execute(_READ, {"p": project_id, "u": user_key(user_id)})
    return [
        MemoryBlock(
            name=r.name, content=r.content, updated_at=r.updated_at, pinned_order=r.pinned_order
        )
        for r in rows
    ]


async def delete_blocks(
    conn: AsyncConnection, project_id: str, user_id: str | None, before: datetime | None
) -> int:
    """Remove the user's blocks (those holding text written before ``before``); how many."""
    rows = await conn.execute(_DELETE, {"p": project_id, "u": user_key(user_id), "before": before})
    return len(rows.all())
