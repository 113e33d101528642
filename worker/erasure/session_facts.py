"""Facts made from a forgotten session (``worker.erasure.forget``, step 2; ``export -s``).

A fact names where it came from (``facts.sources``: episode ids, as the consolidator's lessons
facts and the extractors write them): a session's forget deletes its episodes and turns, and
with them every fact whose sources are all among them (a lesson of the session, its PII and
all). A fact that came from elsewhere too is kept, and only the forgotten episodes' ids leave
its sources: it still says what its other sources say. A fact with no sources is nobody's
session's: a session's forget leaves it (a user's forget takes the user's facts whatever their
sources: ``worker.erasure.users``).

The change feed's events of a deleted fact (``fact.added``, ``fact.superseded``: ids only) go
with it: the outbox rows not yet published (``memory_changes``) here, the entries on
``P:changes:{i}`` (and its DLQ) in the forget's stream step (``worker.erasure.streams``, by the
fact ids this returns), as a user's forget takes the user's.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_OF_THEM = "project_id = :p AND sources ?| CAST(:ids AS text[])"
_OTHER = "coalesce(v #>> '{}', '') <> ALL(CAST(:ids AS text[]))"
"""A source (``v``, an element of ``sources``) that is none of the forgotten episodes."""
_OTHER_SOURCE = f"EXISTS (SELECT 1 FROM jsonb_array_elements(sources) s(v) WHERE {_OTHER})"
_ONLY_THEM = f"{_OF_THEM} AND NOT {_OTHER_SOURCE}"
_ALSO_OTHERS = f"{_OF_THEM} AND {_OTHER_SOURCE}"
_DROP_THEM = (
    "UPDATE facts SET sources = (SELECT coalesce(jsonb_agg(v ORDER BY n), '[]'::jsonb)"
    f" FROM jsonb_array_elements(sources) WITH ORDINALITY s(v, n) WHERE {_OTHER})"
    f" WHERE {_ALSO_OTHERS} RETURNING 1"
)


FACT_EVENTS = ("fact.added", "fact.superseded")
"""The change feed's events that name a fact (``fact_id``): they go with it."""
_FACT_CHANGES = (
    "project_id = :p AND payload->>'type' = ANY(CAST(:kinds AS text[]))"
    " AND payload->>'fact_id' = ANY(CAST(:facts AS text[]))"
)


async def forget_session_facts(
    conn: AsyncConnection, project_id: str, episode_ids: Collection[str], *, dry_run: bool
) -> tuple[dict[str, int], set[str]]:
    """Delete (count, when ``dry_run``) the facts made only from ``episode_ids`` (``facts``)
    and their change-feed events still owed (``memory_changes``), and drop those ids from the
    sources of facts that came from elsewhere too (``fact_sources``: how many facts were kept
    so). With the counts, the ids of the facts deleted (would be, when ``dry_run``)."""
    if not episode_ids:
        return {"facts": 0, "fact_sources": 0, "memory_changes": 0}, set()
    params: dict[str, Any] = {"p": project_id, "ids": sorted(episode_ids)}
    if dry_run:
        found = await conn.execute(text(f"SELECT id::text FROM facts WHERE {_ONLY_THEM}"), params)
        gone = {r[0] for r in found}
        kept = await conn.execute(text(f"SELECT count(*) FROM facts WHERE {_ALSO_OTHERS}"), params)
        n_kept = int(kept.scalar_one())
        changes = await _fact_changes(conn, project_id, gone, dry_run=True)
        return {"facts": len(gone), "fact_sources": n_kept, "memory_changes": changes}, gone
    deleted = await conn.execute(
        text(f"DELETE FROM facts WHERE {_ONLY_THEM} RETURNING id::text"), params
    )
    gone = {r[0] for r in deleted}
    kept = await conn.execute(text(_DROP_THEM), params)
    changes = await _fact_changes(conn, project_id, gone, dry_run=False)
    return {"facts": len(gone), "fact_sources": len(kept.all()), "memory_changes": changes}, gone


async def _fact_changes(
    conn: AsyncConnection, project_id: str, fact_ids: Collection[str], *, dry_run: bool
) -> int:
    """Delete (count, when ``dry_run``) the outbox rows of the facts' events."""
    if not fact_ids:
        return 0
    params = {"p": project_id, "kinds": list(FACT_EVENTS), "facts": sorted(fact_ids)}
    if dry_run:
        statement = f"SELECT count(*) FROM memory_changes WHERE {_FACT_CHANGES}"
        return int((await conn.execute(text(statement), params)).scalar_one())
    statement = f"DELETE FROM memory_changes WHERE {_FACT_CHANGES} RETURNING 1"
    return len((await conn.execute(text(statement), params)).all())


async def export_session_facts(
    conn: AsyncConnection, project_id: str, episode_ids: Collection[str]
) -> list[dict[str, Any]]:
    """The facts ``forget_session_facts`` would delete, as JSON-ready objects."""
    if not episode_ids:
        return []
    rows = await conn.execute(
        text(f"SELECT (to_jsonb(x) - 'search_vector')::text FROM facts x WHERE {_ONLY_THEM}"),
        {"p": project_id, "ids": sorted(episode_ids)},
    )
    return [orjson.loads(r[0]) for r in rows]
