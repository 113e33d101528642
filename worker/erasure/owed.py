"""Forgets still owed: a forget that could not clear every place is recorded, with its exact
scope and cutoff, and finished later to exactly that: by a retry of the same forget (it settles
the owed one), or by ``worker.erasure.forget.finish_owed``, which the consolidator runs at its
start and every ``MEMWORKER_RETENTION_INTERVAL_SECONDS`` (where its Redis user may forget), and
``memworker forget --finish-owed`` runs for an operator.

The record is durable: the erasure's row in Postgres (``erasures.completed_at`` null), or,
when Postgres cannot take it (unreachable), a field of the hash ``P:erasure:owed``
(``worker.keys.owed_forgets_key``; ids and times only). A row covers what it names from the
moment it is written (the consolidator, the replays and the indexer skip that data), so an
owed forget already keeps what it covers from coming back; finishing it removes what is left.
A forget that completes settles every owed one of the same scope it reaches (written before
its instant, and a ``before`` within its own).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy import select, true
from sqlalchemy.ext.asyncio import AsyncEngine

from worker import codec
from worker.db.models import Erasure
from worker.erasure.postgres import write_record
from worker.erasure.receipt import ForgetReceipt
from worker.keys import owed_forgets_key

OWED_GRACE_S = 600.0
"""How old an owed record must be before a pass finishes it (a forget still running owns its
own record until then)."""


@dataclass(frozen=True, slots=True)
class Owed:
    """One forget still owed: its erasure id, exact scope and cutoff, and where it is kept."""

    erasure_id: str
    project_id: str
    session_id: str | None
    user_id: str | None
    before: datetime | None
    cutoff: datetime
    recorded_at: datetime
    where: str = "postgres"
    since: datetime | None = None
    written_before: datetime | None = None
    """When the forget took effect (None: recorded before migration 0011: it covers by
    ``cutoff``)."""

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "project_id": self.project_id,
                "session_id": self.session_id,
                "user_id": self.user_id,
                "before": self.before.isoformat() if self.before else None,
                "since": self.since.isoformat() if self.since else None,
                "cutoff": self.cutoff.isoformat(),
                "recorded_at": self.recorded_at.isoformat(),
                "written_before": self.written_before.isoformat() if self.written_before else None,
            }
        )

    @classmethod
    def from_json(cls, erasure_id: str, raw: bytes | str) -> Owed:
        body: dict[str, Any] = orjson.loads(raw)
        before, since, written = body.get("before"), body.get("since"), body.get("written_before")
        return cls(
            erasure_id,
            body["project_id"],
            body.get("session_id"),
            body.get("user_id"),
            datetime.fromisoformat(before) if before else None,
            datetime.fromisoformat(body["cutoff"]),
            datetime.fromisoformat(body["recorded_at"]),
            "redis",
            datetime.fromisoformat(since) if since else None,
            datetime.fromisoformat(written) if written else None,
        )


async def record_owed(
    engine: AsyncEngine, redis: Redis | None, prefix: str | None, receipt: ForgetReceipt
) -> str | None:
    """Record the incomplete forget of ``receipt`` as owed, durably: its Postgres row (written
    by its own step when that step went through; else now), or ``P:erasure:owed``. Where it
    is kept (``receipt.owed`` too); None when neither store could take it."""
    assert receipt.erasure_id is not None and receipt.cutoff is not None
    try:
        async with engine.begin() as conn:
            await write_record(conn, receipt)
        receipt.owed = "postgres"
    except Exception:  # Postgres cannot take it: Redis keeps it
        if redis is None or prefix is None:
            return None
        owed = Owed(
            receipt.erasure_id,
            receipt.project_id,
            receipt.session_id,
            receipt.user_id,
            receipt.before,
            receipt.cutoff,
            datetime.now(UTC),
            "redis",
            receipt.since,
            receipt.written_before,
        )
        try:
            await redis.hset(owed_forgets_key(prefix), receipt.erasure_id, owed.to_json())  # type: ignore[misc, arg-type]
        except Exception:
            return None
        receipt.owed = "redis"
    return receipt.owed


async def load_owed(
    engine: AsyncEngine,
    redis: Redis | None,
    prefix: str | None,
    grace_seconds: float = OWED_GRACE_S,
    project_id: str | None = None,
) -> list[Owed]:
    """The owed forgets recorded at least ``grace_seconds`` ago (of ``project_id`` only, when
    given), oldest first."""
    limit = datetime.now(UTC) - timedelta(seconds=grace_seconds)
    found: dict[str, Owed] = {}
    if redis is not None and prefix is not None:
        raw: Any = await redis.hgetall(owed_forgets_key(prefix))  # type: ignore[misc]
        for key, value in raw.items():
            owed = Owed.from_json(codec.text(key), value)
            if owed.recorded_at <= limit and project_id in (None, owed.project_id):
                found[owed.erasure_id] = owed
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(
                Erasure.id,
                Erasure.project_id,
                Erasure.session_id,
                Erasure.user_id,
                Erasure.before,
                Erasure.cutoff,
                Erasure.forgotten_at,
                Erasure.since,
                Erasure.written_before,
            ).where(
                Erasure.completed_at.is_(None),
                Erasure.forgotten_at <= limit,
                Erasure.project_id == project_id if project_id is not None else true(),
            )
        )
        for row in rows:
            found[str(row.id)] = Owed(
                str(row.id),
                row.project_id,
                row.session_id,
                row.user_id,
                row.before,
                row.cutoff,
                row.forgotten_at,
                since=row.since,
                written_before=row.written_before,
            )
    return sorted(found.values(), key=lambda o: (o.recorded_at, o.erasure_id))


async def settle_redis(redis: Redis, prefix: str, receipt: ForgetReceipt) -> int:
    """Drop the owed records in ``P:erasure:owed`` a complete forget removed all of: its own,
    and those of the same scope whose cutoff it reaches. How many."""
    if receipt.cutoff is None:
        return 0
    key = owed_forgets_key(prefix)
    raw: Any = await redis.hgetall(key)  # type: ignore[misc]
    done = []
    for name, value in raw.items():
        owed = Owed.from_json(codec.text(name), value)
        same = (owed.project_id, owed.session_id, owed.user_id) == (
            receipt.project_id,
            receipt.session_id,
            receipt.user_id,
        ) and owed.since == receipt.since
        if owed.erasure_id == receipt.erasure_id or (same and _reached(owed, receipt)):
            done.append(name)
    return int(await redis.hdel(key, *done)) if done else 0  # type: ignore[misc]


def _reached(owed: Owed, receipt: ForgetReceipt) -> bool:
    """Did the complete forget ``receipt`` remove all ``owed`` (of the same scope) owes?"""
    assert receipt.cutoff is not None
    if owed.written_before is None or receipt.written_before is None:
        return owed.written_before is None and owed.cutoff <= receipt.cutoff
    if receipt.before is not None and (owed.before is None or owed.before > receipt.before):
        return False
    return owed.written_before <= receipt.written_before


def new_erasure_id() -> str:
    return str(uuid.uuid4())
