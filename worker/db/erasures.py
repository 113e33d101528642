"""What the ``erasures`` table covers, in SQL: the consolidator's and the indexer's check.

A row (``worker.db.models.Erasure``) covers the data of its project (and session, when it names
one; and user, when it names one: ``''`` is the anonymous bucket, data of no user) that was
written before the forget took effect (``written_before``) and, when the forget named a time of
the data, occurred before its ``before`` (and, a range's row, at or after its ``since``): what
the user writes after a forget is kept, whatever time it says it occurred at, and what was
written before a whole forget goes, even dated in the future. A row's written time is its
``recorded_at`` (the INSERT's Postgres clock); a stream entry's, its stream id's time, or its
``occurred_at`` when earlier (an entry published again keeps what it was). A row of before
migration 0011 (``written_before`` null) keeps its rule: what occurred before its ``cutoff``
(and at or after its ``since``). ``memworker forget`` holds the project's advisory lock
exclusive while it writes the row and deletes the rows it covers, and takes ``written_before``
once it holds it (the later of Postgres's clock and Redis's); a writer of the project's rows
holds it shared (``lock_projects``), checks the table in the same transaction and stamps its
rows when it inserts them, so a row is either written before the forget (``recorded_at``
earlier than ``written_before``: deleted by it) or checked and stamped after it (kept unless
its stream entry was published before the forget): never stored after a forget that covers it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

PROJECT_LOCK = "hashtextextended(CAST(:project AS text), 0)"
"""The advisory lock key of one project (bound as ``:project``)."""

NOT_ERASED = """NOT EXISTS (
    SELECT 1 FROM erasures r
    WHERE r.project_id = e.project_id
      AND (r.session_id IS NULL OR r.session_id = e.session_id)
      AND (r.user_id IS NULL OR r.user_id = coalesce(e.user_id, ''))
      AND CASE WHEN r.written_before IS NULL THEN e.occurred_at < r.cutoff
          ELSE e.recorded_at < r.written_before
              AND (r.before IS NULL OR e.occurred_at < r.before) END
      AND (r.since IS NULL OR e.occurred_at >= r.since))"""
"""SQL: the episode ``e`` is not covered by any erasure (written before one that took effect,
in its range of ``occurred_at``; a row of before 0011: by ``occurred_at < cutoff``)."""


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


Item = (
    tuple[str | None, str | None, datetime]
    | tuple[str | None, str | None, datetime, str | None]
    | tuple[str | None, str | None, datetime, str | None, datetime]
)
"""``(project_id, session_id, occurred_at[, user_id[, written_at]])`` of a piece of data (no
user_id, or None: data of no user); no ``written_at``: its ``occurred_at``."""


def written_at(entry_id: str, occurred_at: datetime) -> datetime:
    """When a stream entry was written: its stream id's time, or ``occurred_at`` when earlier
    (an entry published again, by a redrive, keeps the time it had)."""
    try:
        ms = int(entry_id.partition("-")[0])
    except ValueError:
        return occurred_at
    return min(datetime.fromtimestamp(ms / 1000, UTC), occurred_at)


class _Covers:
    """The erasures of one scope, as ``covered`` weighs them."""

    __slots__ = ("legacy", "rules")

    def __init__(self) -> None:
        self.legacy: list[tuple[datetime | None, datetime]] = []  # (since, cutoff)
        self.rules: list[tuple[datetime | None, datetime | None, datetime]] = []
        # (since, before, written_before)

    def cover(self, at: datetime, written: datetime) -> bool:
        return any(a is None or a <= at for a, c in self.legacy if at < c) or any(
            written < w and (b is None or at < b) and (a is None or a <= at)
            for a, b, w in self.rules
        )


async def covered(conn: AsyncConnection, items: Sequence[Item]) -> list[bool]:
    """For each ``(project_id, session_id, occurred_at[, user_id[, written_at]])``: does an
    erasure cover it (module doc)? A project's erasure covers all of it; a session's, the
    session; a user's, the data of that user (``''``: of no user) in the project (or its
    session)."""
    projects = sorted({item[0] for item in items if item[0] is not None})
    if not projects:
        return [False] * len(items)
    rows = await conn.execute(
        text(
            "SELECT project_id, session_id, user_id, since, before, cutoff, written_before"
            " FROM erasures WHERE project_id = ANY(:p)"
        ),
        {"p": projects},
    )
    scopes_of: dict[Scope, _Covers] = {}
    for r in rows:
        rule = scopes_of.setdefault((r[0], r[1], r[2]), _Covers())
        if r[6] is None:
            rule.legacy.append((r[3], r[5]))
        else:
            rule.rules.append((r[3], r[4], r[6]))
    if not scopes_of:
        return [False] * len(items)
    out = []
    for item in items:
        project, session, at = item[0], item[1], item[2]
        user = (item[3] if len(item) > 3 else None) or ""
        written = item[4] if len(item) > 4 else at
        if project is None:
            out.append(False)
            continue
        scopes: list[Scope] = [(project, None, None), (project, None, user)]
        if session:
            scopes += [(project, session, None), (project, session, user)]
        out.append(any(c.cover(at, written) for s in scopes if (c := scopes_of.get(s))))
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
