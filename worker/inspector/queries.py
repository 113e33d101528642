"""What the inspector's pages read from Postgres beyond ``Memory``'s own calls: a project's
counts, its users with theirs (and when each was last active), and a user's facts as a
timeline of valid time. Reads only, each one statement bounded by a ``LIMIT``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.inputs import stored_when

USERS_SHOWN = 100
"""Users listed on the project's page at most (the search narrows them)."""
FACTS_SHOWN = 200
"""Facts on a user's timeline at first (``?facts=`` shows more, up to ``FACTS_MAX``)."""
FACTS_MAX = 5_000


@dataclass
class Counts:
    """Turns, facts, pinned blocks and sessions of a project or one user, and its last
    activity (the newest turn or fact)."""

    turns: int = 0
    facts: int = 0
    blocks: int = 0
    sessions: int = 0
    last_active: datetime | None = None

    def seen(self, when: datetime | None) -> None:
        when = stored_when(when)  # an infinity an older version stored compares too
        if when is not None and (self.last_active is None or when > self.last_active):
            self.last_active = when


@dataclass
class UserRow:
    user_id: str
    counts: Counts = field(default_factory=Counts)


_PROJECT = text(
    "SELECT (SELECT count(*) FROM episodes WHERE project_id = :p AND turn_id IS NOT NULL),"
    " (SELECT count(DISTINCT session_id) FROM episodes WHERE project_id = :p),"
    " (SELECT max(occurred_at) FROM episodes WHERE project_id = :p),"
    " (SELECT count(*) FROM facts WHERE project_id = :p),"
    " (SELECT max(recorded_at) FROM facts WHERE project_id = :p),"
    " (SELECT count(*) FROM memory_blocks WHERE project_id = :p)"
)


async def project_counts(engine: AsyncEngine, project_id: str) -> Counts:
    """The project's counts (every user's, the anonymous bucket's too)."""
    async with engine.connect() as conn:
        turns, sessions, last_turn, facts, last_fact, blocks = (
            await conn.execute(_PROJECT, {"p": project_id})
        ).one()
    counts = Counts(int(turns), int(facts), int(blocks), int(sessions))
    counts.seen(last_turn)
    counts.seen(last_fact)
    return counts


def _like(search: str) -> str:
    """``search`` as a LIKE pattern matching ids that contain it (its wildcards literal)."""
    escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def users(
    engine: AsyncEngine, project_id: str, search: str = "", only: str | None = None
) -> list[UserRow]:
    """The project's named users whose id contains ``search`` (``only``: that user alone),
    the most recently active first, at most ``USERS_SHOWN``."""
    params: dict[str, Any] = {"p": project_id, "q": _like(search), "n": USERS_SHOWN}
    pick = "user_id LIKE :q"
    if only is not None:
        pick, params["u"] = "user_id = :u", only
    pick_key = pick.replace("user_id", "user_key")
    found: dict[str, UserRow] = {}

    def row(user_id: str) -> Counts:
        return found.setdefault(user_id, UserRow(user_id)).counts

    async with engine.connect() as conn:
        episodes = await conn.execute(
            text(
                "SELECT user_id, count(*) FILTER (WHERE turn_id IS NOT NULL) AS turns,"
                " count(DISTINCT session_id) AS sessions, max(occurred_at) AS last"
                f" FROM episodes WHERE project_id = :p AND user_id IS NOT NULL AND {pick}"
                " GROUP BY user_id ORDER BY last DESC LIMIT :n"
            ),
            params,
        )
        for user_id, turns, sessions, last in episodes:
            counts = row(user_id)
            counts.turns, counts.sessions = int(turns), int(sessions)
            counts.seen(last)
        facts = await conn.execute(
            text(
                "SELECT user_id, count(*), max(recorded_at) AS last FROM facts"
                f" WHERE project_id = :p AND user_id IS NOT NULL AND {pick}"
                " GROUP BY user_id ORDER BY last DESC LIMIT :n"
            ),
            params,
        )
        for user_id, n, last in facts:
            counts = row(user_id)
            counts.facts = int(n)
            counts.seen(last)
        blocks = await conn.execute(
            text(
                "SELECT user_key, count(*), max(updated_at) AS last FROM memory_blocks"
                f" WHERE project_id = :p AND user_key <> '' AND {pick_key}"
                " GROUP BY user_key ORDER BY last DESC LIMIT :n"
            ),
            params,
        )
        for user_id, n, last in blocks:
            counts = row(user_id)
            counts.blocks = int(n)
            counts.seen(last)
    rows = sorted(
        found.values(),
        key=lambda r: (r.counts.last_active is not None, r.counts.last_active, r.user_id),
        reverse=True,
    )
    return rows[:USERS_SHOWN]


@dataclass(frozen=True)
class TimelineFact:
    """A fact on the timeline: ``superseded`` when its valid time has ended."""

    id: str
    subject: str
    predicate: str
    object: str
    confidence: float
    valid_from: datetime
    valid_until: datetime | None
    recorded_at: datetime
    sources: list[str]
    superseded: bool


async def facts_timeline(
    engine: AsyncEngine, project_id: str, user_id: str, limit: int
) -> tuple[list[TimelineFact], int]:
    """The user's facts, the latest valid first (at most ``limit``), and how many there are."""
    params = {"p": project_id, "u": user_id, "n": limit}
    async with engine.connect() as conn:
        total = await conn.scalar(
            text("SELECT count(*) FROM facts WHERE project_id = :p AND user_id = :u"), params
        )
        rows = await conn.execute(
            text(
                "SELECT id, subject, predicate, object, confidence, valid_from, valid_until,"
                " recorded_at, sources, valid_until IS NOT NULL AND valid_until <= now()"
                " FROM facts WHERE project_id = :p AND user_id = :u"
                " ORDER BY valid_from DESC, recorded_at DESC, id LIMIT :n"
            ),
            params,
        )
        found = [
            TimelineFact(
                r[0],
                r[1],
                r[2],
                r[3],
                float(r[4]),
                r[5],
                r[6],
                r[7],
                [str(s) for s in (r[8] or [])],
                bool(r[9]),
            )
            for r in rows
        ]
    return found, int(total or 0)


async def session_count(engine: AsyncEngine, project_id: str, user_id: str) -> int:
    """How many sessions the user's turns and episodes belong to."""
    async with engine.connect() as conn:
        found = await conn.scalar(
            text(
                "SELECT count(DISTINCT session_id) FROM episodes"
                " WHERE project_id = :p AND user_id = :u"
            ),
            {"p": project_id, "u": user_id},
        )
    return int(found or 0)
