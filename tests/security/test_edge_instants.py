"""The two edge instants of the time rule, ``0001-01-01T00:00:00Z`` and
``9999-12-31T23:59:59.999999Z``: asyncpg sends them to Postgres as ``-infinity`` and
``infinity``, which come back as times with no zone. Before, ``remember`` stored them; then the
inspector's home page answered 400 "can't compare offset-naive and offset-aware datetimes" to
everyone, as did ``recall`` with an ``until``. Now every door refuses them naming the field,
and a row an older version stored at infinity breaks no page and no recall. Real ``memworker
serve`` and ``memworker mcp`` on real Redis and Postgres."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from schemas.inputs import InvalidInputError
from tests.helpers import worker_env
from tests.inspector_server import TOKEN, env_for, serving
from tests.integration.results_factory import migrated_engine
from tests.security.test_hostile_fields import McpStdio
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

AUTH = {"Authorization": f"Bearer {TOKEN}"}
EARLIEST = datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999998, tzinfo=UTC)
"""The first and last instants the rule takes."""
EDGES = [
    "9999-12-31T23:59:59.999999Z",
    "9999-12-31T22:59:59.999999-01:00",
    "9999-12-31T23:59:59.9999999Z",
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00",
]
TURN = {"user_id": "ann", "session_id": "edge", "input": "edge turn", "output": "ok"}
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("remember", TURN, "occurred_at"),
    ("forget", {"user_id": "ann"}, "before"),
    ("forget", {"user_id": "ann", "before": "2026-01-01T00:00:00Z"}, "since"),
    ("recall", {"user_id": "ann", "query": "x"}, "until"),
    ("recall", {"user_id": "ann", "query": "x"}, "since"),
    ("recall_facts", {"user_id": "ann"}, "valid_at"),
    ("add_fact", {"user_id": "ann", "subject": "a", "predicate": "b", "object": "c"}, "valid_from"),
]


@pytest.fixture
async def env(redis: Redis, settings: Settings, database_url: str) -> dict[str, str]:
    async with migrated_engine(database_url):
        pass
    return env_for(settings, database_url)


async def _rows(database_url: str, sql: str) -> list[Any]:
    engine = create_async_engine(database_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.begin() as conn:
            result = await conn.execute(text(sql))
            return list(result) if result.returns_rows else []
    finally:
        await engine.dispose()


async def test_the_edge_instants_are_refused_at_every_http_field(
    env: dict[str, str], database_url: str
) -> None:
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=AUTH) as http:
            for edge in EDGES:
                for tool, body, field in CASES:
                    got = await http.post(f"/v1/{tool}", json={**body, field: edge})
                    assert got.status_code == 422, (tool, field, edge, got.text)
                    error = got.json()["error"]
                    assert field in error and "infinity" in error, (tool, field, error)
                turns = [TURN, {**TURN, "occurred_at": edge}]
                got = await http.post("/v1/remember_many", json={"user_id": "ann", "turns": turns})
                assert got.status_code == 422, (edge, got.text)
                assert "occurred_at" in got.json()["error"]
    # nothing was stored, and no time in Postgres is infinite
    assert await _rows(database_url, "SELECT input FROM episodes") == []
    assert await _rows(database_url, "SELECT id FROM facts") == []


async def test_the_edge_instants_are_refused_over_mcp_and_in_python(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    settings = settings.model_copy(update={"database_url": database_url})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "worker.cli", "mcp", "--project", "edges"),
        env=worker_env(settings),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    mcp = McpStdio(proc)
    try:
        hello = {"name": "edges", "version": "1"}
        started = await mcp.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": hello},
        )
        assert "result" in started, started
        await mcp.notify("notifications/initialized")
        for edge in EDGES:
            arguments = {**TURN, "occurred_at": edge}
            answer = await mcp.request("tools/call", {"name": "remember", "arguments": arguments})
            assert answer["result"]["isError"], answer
            error = json.loads(answer["result"]["content"][0]["text"])["error"]
            assert "occurred_at" in error and "\n" not in error, error
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
    memory = Memory("edges", settings=settings, redis=redis)
    try:
        for instant in (datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC)):
            with pytest.raises(ValueError, match="occurred_at"):
                await memory.remember(Episode(**TURN, occurred_at=instant))
            with pytest.raises(InvalidInputError, match="time_range"):
                await memory.recall("x", user_id="ann", time_range=(EARLIEST, instant))
            with pytest.raises(ValueError, match="before"):
                await memory.forget(user_id="ann", before=instant)
        # the edges the rule keeps are taken, and come back as they went
        west = (LATEST - timedelta(hours=1)).astimezone(timezone(timedelta(hours=-1)))
        for when in (EARLIEST, LATEST, west):
            await memory.remember(Episode(**TURN, occurred_at=when))
        back = await memory.recall("", user_id="ann", limit=10)
        assert sorted(e.occurred_at for e in back) == [
            EARLIEST,
            LATEST - timedelta(hours=1),
            LATEST,
        ]
    finally:
        await memory.close()
    assert (
        await _rows(database_url, "SELECT 1 FROM episodes WHERE isfinite(occurred_at) = false")
        == []
    )


async def test_a_turn_stored_at_infinity_breaks_no_page_and_can_be_forgotten(
    env: dict[str, str], database_url: str
) -> None:
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for user, words in (
                ("ann", "ferry to the island"),
                ("bob", "ferry at dawn"),
                ("cy", "ferry at dusk"),
            ):
                body = {**TURN, "user_id": user, "input": words}
                assert (await http.post("/v1/remember", json=body, headers=AUTH)).status_code == 200
                block = {"user_id": user, "name": "persona", "content": words}
                got = await http.post("/v1/update_block", json=block, headers=AUTH)
                assert got.status_code == 200, got.text
            # what an older version stored from 9999-12-31T23:59:59.999999Z and
            # 0001-01-01T00:00:00Z; bob's turn keeps its time
            await _rows(
                database_url,
                "UPDATE episodes SET occurred_at = CASE user_id WHEN 'ann' THEN 'infinity'"
                "::timestamptz ELSE '-infinity'::timestamptz END WHERE user_id <> 'bob'",
            )
            signed = await http.post("/ui/login", data={"token": TOKEN, "next": "/ui/"})
            assert signed.status_code == 303, signed.text
            for url in (
                "/ui/",
                "/ui/?q=a",
                "/ui/users/ann",
                "/ui/users/cy",
                "/ui/users/ann/sessions/edge",
                "/ui/users/ann/recall?q=ferry",
            ):
                page = await http.get(url)
                assert page.status_code == 200, (url, page.text)
                assert "offset-naive" not in page.text
            assert "ann" in (await http.get("/ui/")).text
            for until in ("9999-12-31T23:59:59Z", "2026-01-01T00:00:00Z"):
                body = {
                    "user_id": "ann",
                    "query": "ferry",
                    "until": until,
                    "since": "2000-01-01T00:00:00Z",
                }
                got = await http.post("/v1/recall", json=body, headers=AUTH)
                assert got.status_code == 200, (until, got.text)
            got = await http.post(
                "/v1/recall", json={"user_id": "ann", "query": "ferry"}, headers=AUTH
            )
            assert got.status_code == 200 and "island" in got.text, got.text
            # the user's forget erases them
            for user in ("ann", "bob", "cy"):
                got = await http.post("/v1/forget", json={"user_id": user}, headers=AUTH)
                assert got.status_code == 200, got.text
    assert await _rows(database_url, "SELECT input FROM episodes") == []
