"""The inspector's recall page shows each matching fact's scores as the API returns them:
facts embedded by the indexer (pgvector's database, the local model), a real ``memworker
serve``, the page's facts table read cell by cell and compared with
``Memory.recall_facts_scored`` (the same order; vector, words and fused score), and
``FactStore.recall_scored`` in ``recall_facts``' order."""

from __future__ import annotations

import re
from html import unescape

import httpx
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.inspector_server import PROJECT, TOKEN, env_for, serving
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Fact

CLAIMS = [
    ("likes", "spicy Thai curry"),
    ("owns", "a red bicycle"),
    ("commutes_by", "the Cacilhas ferry"),
    ("likes", "green tea in the morning"),
    ("cooks", "spicy bacalhau on Sundays"),
]
QUERY = "what spicy food does she enjoy"


def facts_table(html: str) -> list[list[str]]:
    """The cells of the page's facts table, row by row, as text."""
    table = html.split('<table id="facts">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>", 1)[1], re.S)
    cells = [re.findall(r"<td>(.*?)</td>", row, re.S) for row in rows]
    return [[" ".join(unescape(re.sub(r"<[^>]+>", " ", c)).split()) for c in row] for row in cells]


def shown(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


async def test_the_recall_page_shows_the_fact_scores_the_api_returns(
    vector_engine: AsyncEngine,
    redis: Redis,
    vector_settings: Settings,
    vector_database_url: str,
    embedder: LocalEmbedder,
) -> None:
    async with Memory(PROJECT, settings=vector_settings, engine=vector_engine, redis=redis) as mem:
        for predicate, obj in CLAIMS:
            await mem.facts.append(
                Fact(user_id="ann", subject="ann", predicate=predicate, object=obj)
            )
        await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
        # one more, not embedded yet: found by its words alone
        await mem.facts.append(
            Fact(user_id="ann", subject="ann", predicate="orders", object="spicy noodles")
        )
        expected = await mem.recall_facts_scored(QUERY, limit=10, user_id="ann")
        plain = await mem.recall_facts(QUERY, limit=10, user_id="ann")
    assert [m.fact.id for m in expected] == [f.id for f in plain], "recall_facts' order"
    both = [m for m in expected if m.vector_score is not None and m.word_score is not None]
    assert both and any(m.vector_score is None for m in expected), "both kinds of match"

    with serving(env_for(vector_settings, vector_database_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            page = await http.get(
                "/ui/users/ann/recall",
                params={"q": QUERY, "limit": "10"},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
    assert page.status_code == 200, page.text
    rows = facts_table(page.text)
    assert len(rows) == len(expected)
    for row, match in zip(rows, expected, strict=True):
        _number, claim, vector, words, fused = row
        f = match.fact
        assert claim.startswith(f"{f.subject} {f.predicate} {f.object}"), (row, f)
        assert vector.split()[0] == shown(match.vector_score), (row, match)
        assert words == shown(match.word_score), (row, match)
        assert fused == shown(match.score, 4), (row, match)
    assert "Relevance floor" in page.text
