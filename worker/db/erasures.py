"""What the ``erasures`` table covers, in SQL: the consolidator's and the indexer's check.

A row (``worker.db.models.Erasure``) covers the data of its project (and session, when it names
one) that occurred before its ``cutoff``. ``memworker forget`` holds the project's advisory
lock exclusive while it writes the row and deletes the rows it covers; a writer of the
project's rows holds it shared (``lock_projects``) and checks the table in the same
transaction, so a row is either written before the forget (and deleted by it) or checked after
it (and skipped): never stored after a forget that covers it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

PROJECT_LOCK = "hashtextextended(CAST(:project AS text), 0)"
"""The advisory lock key of one project (bound as ``:project``)."""

NOT_ERASED = """NOT EXISTS (
    SELECT 1 FROM erasures r
    WHERE r.project_id = e.project_id
      AND (r.session_id IS NULL OR r.session_id = e.session_id)
      AND e.occurred_at < r.cutoff)"""
"""SQL: the episode ``e`` is not covered by any erasure."""


async def lock_project(conn: AsyncConnection, project_id: str) -> None:
    """The project's lock, exclusive, until the transaction ends (a forget)."""
    await conn.execute(
        text(f"SELECT pg_advisory_xact_lock({PROJECT_LOCK})"), {"project": project_id}
    )


async def lock_projects(conn: AsyncConnection, projects: Iterable[str]) -> None:
    """The projects' locks, shared, until the transaction ends (a writer of their rows): one
    statement, taken in one order, so two writers never wait on each other."""
    wanted = sorted(set(projects))
    if not wanted:
        return
    await conn.execute(
        text(
            "SELECT count(pg_advisory_xact_lock_shared(hashtextextended(p, 0)))"
            " FROM (SELECT p FROM unnest(CAST(:projects AS text[])) AS p ORDER BY p) AS o"
        ),
        {"projects": wanted},
    )


async def erasure_cutoffs(conn: AsyncConnection) -> dict[tuple[str, str | None], datetime]:
    """The latest cutoff of every scope (project, or project and session) ever forgotten."""
    rows = await conn.execute(
        text("SELECT project_id, session_id, max(cutoff) FROM erasures GROUP BY 1, 2")
    )
    return {(r[0], r[1]): r[2] for r in rows}


async def covered(
    conn: AsyncConnection, items: Sequence[tuple[str | None, str | None, datetime]]
) -> list[bool]:
    """For each ``(project_id, session_id, occurred_at)``: does an erasure cover it?"""
    projects = sorted({p for p, _s, _t in items if p is not None})
    if not projects:
        return [False] * len(items)
    rows = await conn.execute(
        text("SELECT project_id, session_id, cutoff FROM erasures WHERE project_id = ANY(:p)"),
        {"p": projects},
    )
    cutoffs: dict[tuple[str, str | None], datetime] = {}
    for project, session, cutoff in rows:
        known = cutoffs.get((project, session))
        if known is None or known < cutoff:
            cutoffs[(project, session)] = cutoff
    if not cutoffs:
        return [False] * len(items)
    out = []
    for project, session, at in items:
        whole = cutoffs.get((project, None)) if project is not None else None
        own = cutoffs.get((project, session)) if project is not None and session else None
        out.append((whole is not None and at < whole) or (own is not None and at < own))
    return out
