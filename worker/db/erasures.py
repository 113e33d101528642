"""What the ``erasures`` table covers, in SQL: the consolidator's and the indexer's check.

A row (``worker.db.models.Erasure``) covers the data of its project (and session, when it names
one; and user, when it names one: ``''`` is the anonymous bucket, data of no user) that
occurred before its ``cutoff`` (and, a range's row, at or after its ``since``: never
widened to all that is older). ``memworker forget`` holds the project's advisory
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
      AND (r.user_id IS NULL OR r.user_id = coalesce(e.user_id, ''))
      AND e.occurred_at < r.cutoff
      AND (r.since IS NULL OR e.occurred_at >= r.since))"""
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


Scope = tuple[str, str | None, str | None]
"""What an erasure covers: ``(project, session or None, user or None)``; user ``''``: the
anonymous bucket."""


async def erasure_cutoffs(conn: AsyncConnection) -> dict[Scope, datetime]:
    """The latest cutoff of every scope (project; and session; and user) ever forgotten (a
    range's row is not a cutoff: left out)."""
    rows = await conn.execute(
        text(
            "SELECT project_id, session_id, user_id, max(cutoff) FROM erasures"
            " WHERE since IS NULL GROUP BY 1, 2, 3"
        )
    )
    return {(r[0], r[1], r[2]): r[3] for r in rows}


async def erasure_ranges(conn: AsyncConnection) -> list[tuple[Scope, datetime, datetime]]:
    """Every forget of a time range: its scope, start (``since``) and cutoff."""
    rows = await conn.execute(
        text(
            "SELECT DISTINCT project_id, session_id, user_id, since, cutoff FROM erasures"
            " WHERE since IS NOT NULL"
        )
    )
    return [((r[0], r[1], r[2]), r[3], r[4]) for r in rows]


Item = tuple[str | None, str | None, datetime] | tuple[str | None, str | None, datetime, str | None]
"""``(project_id, session_id, occurred_at[, user_id])`` of a piece of data (no user_id, or
None: data of no user)."""


async def covered(conn: AsyncConnection, items: Sequence[Item]) -> list[bool]:
    """For each ``(project_id, session_id, occurred_at[, user_id])``: does an erasure cover
    it? A project's erasure covers all of it; a session's, the session; a user's, the data of
    that user (``''``: of no user) in the project (or its session)."""
    projects = sorted({item[0] for item in items if item[0] is not None})
    if not projects:
        return [False] * len(items)
    rows = await conn.execute(
        text(
            "SELECT project_id, session_id, user_id, max(cutoff) FROM erasures"
            " WHERE project_id = ANY(:p) AND since IS NULL GROUP BY 1, 2, 3"
        ),
        {"p": projects},
    )
    cutoffs: dict[Scope, datetime] = {(r[0], r[1], r[2]): r[3] for r in rows}
    ranges: dict[Scope, list[tuple[datetime, datetime]]] = {}
    for r in await conn.execute(
        text(
            "SELECT project_id, session_id, user_id, since, cutoff FROM erasures"
            " WHERE project_id = ANY(:p) AND since IS NOT NULL"
        ),
        {"p": projects},
    ):
        ranges.setdefault((r[0], r[1], r[2]), []).append((r[3], r[4]))
    if not cutoffs and not ranges:
        return [False] * len(items)
    out = []
    for item in items:
        project, session, at = item[0], item[1], item[2]
        user = (item[3] if len(item) > 3 else None) or ""
        if project is None:
            out.append(False)
            continue
        scopes: list[Scope] = [(project, None, None), (project, None, user)]
        if session:
            scopes += [(project, session, None), (project, session, user)]
        out.append(
            any((c := cutoffs.get(s)) is not None and at < c for s in scopes)
            or any(a <= at < c for s in scopes for a, c in ranges.get(s, ()))
        )
    return out


async def session_erasure(
    conn: AsyncConnection, project_id: str, session_id: str | None
) -> tuple[bool, datetime] | None:
    """The latest forget that may have removed this session's episode: (whether it named the
    session, its cutoff); None if none did. A forget of one user's data is left out (whose
    session this was is gone with it)."""
    found = await conn.execute(
        text(
            "SELECT session_id IS NOT NULL, cutoff FROM erasures WHERE project_id = :project"
            " AND (session_id IS NULL OR session_id = :session) AND user_id IS NULL"
            " AND since IS NULL"
            " ORDER BY session_id IS NOT NULL DESC, cutoff DESC LIMIT 1"
        ),
        {"project": project_id, "session": session_id},
    )
    row = found.first()
    return None if row is None else (bool(row[0]), row[1])
