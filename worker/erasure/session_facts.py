"""Facts made from a forgotten session (``worker.erasure.forget``, step 2; ``export -s``).

A fact names where it came from (``facts.sources``: episode ids, as the consolidator's lessons
facts and the extractors write them): a session's forget deletes its episodes and turns, and
with them every fact whose sources are all among them (a lesson of the session, its PII and
all). A fact that came from elsewhere too is kept, and only the forgotten episodes' ids leave
its sources: it still says what its other sources say. A fact with no sources is nobody's
session's: a session's forget leaves it (a user's forget takes the user's facts whatever their
sources: ``worker.erasure.users``).
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


async def forget_session_facts(
    conn: AsyncConnection, project_id: str, episode_ids: Collection[str], *, dry_run: bool
) -> dict[str, int]:
    """Delete (count, when ``dry_run``) the facts made only from ``episode_ids`` (``facts``),
    and drop those ids from the sources of facts that came from elsewhere too
    (``fact_sources``: how many facts were kept so)."""
    if not episode_ids:
        return {"facts": 0, "fact_sources": 0}
    params = {"p": project_id, "ids": sorted(episode_ids)}
    if dry_run:
        counts = {}
        for name, where in (("facts", _ONLY_THEM), ("fact_sources", _ALSO_OTHERS)):
            found = await conn.execute(text(f"SELECT count(*) FROM facts WHERE {where}"), params)
            counts[name] = int(found.scalar_one())
        return counts
    gone = await conn.execute(text(f"DELETE FROM facts WHERE {_ONLY_THEM} RETURNING 1"), params)
    n_gone = len(gone.all())
    kept = await conn.execute(text(_DROP_THEM), params)
    return {"facts": n_gone, "fact_sources": len(kept.all())}


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
