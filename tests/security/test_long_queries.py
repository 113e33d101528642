"""A recall's work is bounded by the words it searches by, the same rule at every door: a query
of more than ``MAX_QUERY_WORDS`` distinct words is searched by that many, in its order but the
table's common words (in more than 5% of its rows, by Postgres's statistics) last. Measured on
real servers at every door (``Memory``, ``EpisodeStore``, ``memworker serve`` and its
inspector, ``memworker mcp`` over stdio, the CLI's two recalls): a word past the bound finds
nothing by words, the same word within it does; a 32 KiB query of distinct words is answered,
not refused. Before, every word of the query was searched (a 32 KiB query of matched words
cost seconds: BENCHMARKS.md)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import string
import sys
from typing import Any

import httpx
from redis.asyncio import Redis
from sqlalchemy import text

from schemas.limits import MAX_QUERY_BYTES, MAX_QUERY_WORDS
from tests.cli_process import Memworker
from tests.helpers import worker_env
from tests.integration.test_access import free_port, migrated
from tests.integration.test_client_and_cli import memworker
from worker.episodes.store import EpisodeStore
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Fact

PROJECT = "longq"
USER = "reader"
RARE = "quokka"
COMMON = "kettle"


def absent_words(count: int) -> list[str]:
    """``count`` distinct words no turn holds (each its own English stem)."""
    letters = itertools.product(string.ascii_lowercase, repeat=3)
    return [f"vq{''.join(tail)}x" for tail in itertools.islice(letters, count)]


NOISE = " ".join(absent_words(2 * MAX_QUERY_WORDS))
PAST = f"{NOISE} {RARE}"
"""The rare word said after more than ``MAX_QUERY_WORDS`` words as rare (found nowhere)."""
WITHIN = f"{RARE} {NOISE}"
"""The same words, the rare one first."""


def found_by_words(matches: list[dict[str, Any]], word: str, field: str) -> bool:
    """Whether a match holding ``word`` was found by words (its ``field`` score set)."""
    return any(
        word in (m.get("input") or m.get("episode", {}).get("input") or m.get("task") or "")
        and m.get(field) is not None
        for m in matches
    )


async def stored(settings: Settings, database_url: str) -> Settings:
    settings = await migrated(settings, database_url)
    memory = Memory(project_id=PROJECT, settings=settings)
    try:
        turns = [
            Episode(user_id=USER, session_id="zoo", input=f"we saw a {RARE} today", output="noted")
        ]
        turns += [
            Episode(
                user_id=USER, session_id="kitchen", input=f"the {COMMON} boils {n}", output="ok"
            )
            for n in range(30)
        ]
        await memory.remember_many(turns)
        async with memory.engine.begin() as conn:
            await conn.execute(text("ANALYZE episodes"))  # the statistics rarity is read from
    finally:
        await memory.close()
    return settings


async def test_python_doors_search_by_at_most_max_query_words_common_ones_last(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await stored(settings, database_url)
    memory = Memory(project_id=PROJECT, settings=settings)
    try:

        async def by_words(query: str, word: str) -> bool:
            matches = await memory.recall_scored(query, user_id=USER, limit=40, alpha=0.0)
            return found_by_words([m.model_dump() for m in matches], word, "bm25_score")

        assert await by_words(WITHIN, RARE)
        assert not await by_words(PAST, RARE)  # past the bound: not searched by
        # a common word (the statistics list it) is dropped first, even said first
        assert await by_words(f"{COMMON} {' '.join(absent_words(10))}", COMMON)
        assert not await by_words(f"{COMMON} {NOISE}", COMMON)
        # the longest query is answered, searched by its first words
        longest = " ".join(absent_words(6000))[: MAX_QUERY_BYTES - len(RARE) - 1]
        assert await by_words(f"{RARE} {longest}", RARE)
        # facts: the same rule
        await memory.facts.append(
            Fact(user_id=USER, subject="reader", predicate="saw", object=f"a {RARE}")
        )

        async def fact_found(query: str) -> bool:
            facts = await memory.recall_facts(query, limit=40, user_id=USER)
            return any(RARE in f.object for f in facts)

        assert await fact_found(WITHIN)
        assert not await fact_found(PAST)
        store = EpisodeStore(memory.engine)

        async def store_by_words(query: str) -> bool:
            hits = await store.recall(PROJECT, query, 40, user_id=USER, mode="text")
            return any(RARE in h.to_dict()["input"] and h.text_score for h in hits)

        assert await store_by_words(WITHIN)
        assert not await store_by_words(PAST)
    finally:
        await memory.close()


async def test_every_process_door_applies_the_same_bound(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await stored(settings, database_url)
    env = worker_env(settings, MEMWORKER_API_TOKEN="longq-token")
    seen: dict[str, tuple[bool, bool]] = {}

    # the CLI: user memory's recall and the project's episodes' recall
    def cli(query: str, *args: str) -> list[dict[str, Any]]:
        done = memworker(settings, *args, query, "--json")
        assert done.returncode == 0, done.stderr
        return list(json.loads(done.stdout))

    user_args = ("memory", "recall", "-p", PROJECT, "-u", USER, "--limit", "40")
    seen["cli memory recall"] = (
        found_by_words(cli(WITHIN, *user_args), RARE, "bm25_score"),
        found_by_words(cli(PAST, *user_args), RARE, "bm25_score"),
    )
    store_args = ("recall", "-p", PROJECT, "--user", USER, "--limit", "40")
    seen["cli recall"] = (
        found_by_words(cli(WITHIN, *store_args), RARE, "text_score"),
        found_by_words(cli(PAST, *store_args), RARE, "text_score"),
    )

    # memworker serve
    port = free_port()
    process = Memworker(
        ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
    )
    try:
        process.wait_for(f"on http://127.0.0.1:{port}")
        auth = {"Authorization": "Bearer longq-token"}
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=60, headers=auth
        ) as http:

            async def served(query: str) -> bool:
                got = await http.post(
                    "/v1/recall", json={"query": query, "user_id": USER, "limit": 40}
                )
                assert got.status_code == 200, got.text
                return found_by_words(got.json(), RARE, "bm25_score")

            seen["serve"] = (await served(WITHIN), await served(PAST))

            # the inspector's recall page, on the same server
            signed = await http.post("/ui/login", data={"token": "longq-token", "next": "/ui/"})
            assert signed.status_code == 303, signed.text

            async def inspected(query: str) -> bool:
                page = await http.get(f"/ui/users/{USER}/recall", params={"q": query})
                assert page.status_code == 200, page.text
                cells = re.search(
                    rf"{RARE} today</pre>.*?</td>\s*<td>.*?</td>\s*<td>([^<]*)</td>",
                    page.text,
                    re.DOTALL,
                )
                # the Words column: its BM25, or none (not listed: not found by words)
                return cells is not None and cells[1].strip() != "–"

            seen["inspector"] = (await inspected(WITHIN), await inspected(PAST))
    finally:
        process.close()

    # memworker mcp over stdio
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.cli",
        "mcp",
        "--project",
        PROJECT,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=16 << 20,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:

        async def rpc(request_id: int, method: str, params: dict[str, Any]) -> Any:
            assert proc.stdin is not None and proc.stdout is not None
            line = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            proc.stdin.write(json.dumps(line).encode() + b"\n")
            await proc.stdin.drain()
            while True:
                raw = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
                assert raw, "the MCP server closed stdout"
                answer = json.loads(raw)
                if answer.get("id") == request_id:
                    return answer["result"]

        await rpc(
            1,
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        )
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')

        async def called(request_id: int, query: str) -> bool:
            arguments = {"query": query, "user_id": USER, "limit": 40}
            result = await rpc(request_id, "tools/call", {"name": "recall", "arguments": arguments})
            assert not result.get("isError"), result
            return found_by_words(json.loads(result["content"][0]["text"]), RARE, "bm25_score")

        seen["mcp"] = (await called(2, WITHIN), await called(3, PAST))
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.communicate()

    assert seen == dict.fromkeys(seen, (True, False)), seen
