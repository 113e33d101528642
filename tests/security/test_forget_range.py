"""The forget range (``since`` with ``before``) at both doors, real ``memworker serve`` and
``memworker mcp`` on real Redis and Postgres: a range the wrong way round, a ``since`` without
``before`` or one no store can hold is one line naming the field (HTTP 400 or 422, MCP ``isError``),
nothing is erased; a good range forgets that range only. (Every other hostile value of
``since`` is sent by ``test_hostile_fields``, which enumerates every field.)"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.cli_process import Memworker
from tests.helpers import worker_env
from tests.integration.test_access import free_port, migrated
from tests.security.test_hostile_fields import McpStdio
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

PROJECT, USER, TOKEN = "ranged", "ann", "range-token-8c1d"
MONTHS = ("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z")
BAD = [
    ({"since": "2026-02-15T00:00:00Z", "before": "2026-01-15T00:00:00Z"}, ("since", "before")),
    ({"since": "2026-01-15T00:00:00Z"}, ("since", "before")),
    ({"since": "0001-01-01T00:00:00+14:00", "before": "2026-01-15T00:00:00Z"}, ("since",)),
]
GOOD = {"since": "2026-01-15T00:00:00Z", "before": "2026-02-15T00:00:00Z"}


async def seeded(redis: Redis, settings: Settings, database_url: str) -> Settings:
    settings = await migrated(settings, database_url)
    memory = Memory(PROJECT, settings=settings, redis=redis)
    try:
        for when in MONTHS:
            await memory.remember(
                Episode(session_id="chat", user_id=USER, occurred_at=when, input=when, output="ok")
            )
    finally:
        await memory.close()
    return settings


async def turns(database_url: str) -> list[str]:
    engine = create_async_engine(database_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT input FROM episodes WHERE project_id = :p ORDER BY occurred_at"),
                {"p": PROJECT},
            )
            return [r[0] for r in rows]
    finally:
        await engine.dispose()


async def test_the_http_door_refuses_a_bad_range_naming_it_and_forgets_a_good_one(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await seeded(redis, settings, database_url)
    port = free_port()
    env = worker_env(settings, MEMWORKER_API_TOKEN=TOKEN)
    process = Memworker(
        ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
    )
    try:
        process.wait_for(f"on http://127.0.0.1:{port}")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=auth) as http:
            for times, named in BAD:
                got = await http.post("/v1/forget", json={"user_id": USER, **times})
                assert got.status_code in (400, 422), (times, got.text)
                error = got.json()["error"]
                assert "\n" not in error and all(n in error for n in named), (times, error)
            assert len(await turns(database_url)) == 3
            done = await http.post("/v1/forget", json={"user_id": USER, **GOOD})
            assert done.status_code == 200, done.text
            assert done.json() == {"forgotten": 1}
    finally:
        process.close()
    assert await turns(database_url) == [MONTHS[0], MONTHS[2]]


@pytest.mark.parametrize(("times", "named"), BAD)
async def test_the_mcp_door_refuses_a_bad_range_naming_it(
    redis: Redis,
    settings: Settings,
    database_url: str,
    times: dict[str, str],
    named: tuple[str, ...],
) -> None:
    settings = await seeded(redis, settings, database_url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.cli",
        "mcp",
        "--project",
        PROJECT,
        env=worker_env(settings),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    mcp = McpStdio(proc)
    try:
        hello = {"name": "range", "version": "1"}
        started = await mcp.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": hello},
        )
        assert "result" in started, started
        await mcp.notify("notifications/initialized")
        arguments = {"user_id": USER, **times}
        answer = await mcp.request("tools/call", {"name": "forget", "arguments": arguments})
        assert answer["result"]["isError"], answer
        error = json.loads(answer["result"]["content"][0]["text"])["error"]
        assert "\n" not in error and all(n in error for n in named), error
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
    assert len(await turns(database_url)) == 3
