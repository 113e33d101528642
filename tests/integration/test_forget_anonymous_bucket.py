"""The anonymous bucket (what was stored without a user) can be forgotten at every door that
can store into it, on real Redis and Postgres with ``memworker serve`` and the CLI: HTTP
``forget`` with ``"anonymous": true`` and ``memworker forget --anonymous`` take the facts and
blocks stored without a user and keep a named user's; ``anonymous`` with ``user_id`` is
refused naming the field. Before, ``forget {}`` and ``{"user_id": null}`` were refused
"forget needs a selector" and the CLI could only forget the whole project."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis
from sqlalchemy import text as sql

from tests.cli_process import Memworker
from tests.integration.results_factory import migrated_engine
from tests.integration.test_access import AUTH, PROJECT, api
from tests.integration.test_client_and_cli import memworker
from worker.settings import Settings

__all__ = ["api"]


async def stored(database_url: str) -> dict[str, Any]:
    async with migrated_engine(database_url) as engine, engine.connect() as conn:
        facts = await conn.execute(
            sql("SELECT coalesce(user_id, ''), object FROM facts WHERE project_id = :p"),
            {"p": PROJECT},
        )
        blocks = await conn.execute(
            sql("SELECT user_key, content FROM memory_blocks WHERE project_id = :p"),
            {"p": PROJECT},
        )
        return {"facts": sorted(map(tuple, facts)), "blocks": sorted(map(tuple, blocks))}


async def seed(http: httpx.AsyncClient) -> None:
    for user in (None, "ann"):
        named = {} if user is None else {"user_id": user}
        fact = {"subject": "me", "predicate": "card", "object": f"PII-{user}", **named}
        block = {"name": "persona", "content": f"BLOCK-{user}", **named}
        for path, body in (("/v1/add_fact", fact), ("/v1/update_block", block)):
            got = await http.post(path, json=body, headers=AUTH)
            assert got.status_code == 200, got.text


async def test_the_anonymous_bucket_is_forgotten_over_http_and_the_cli(
    api: tuple[str, Memworker], redis: Redis, settings: Settings, database_url: str
) -> None:
    base, _ = api
    kept = {"facts": [("ann", "PII-ann")], "blocks": [("ann", "BLOCK-ann")]}
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        await seed(http)
        both = await http.post(
            "/v1/forget", json={"anonymous": True, "user_id": "ann"}, headers=AUTH
        )
        assert both.status_code == 400 and both.json()["error"].startswith("anonymous"), both.text
        bad = await http.post("/v1/forget", json={"anonymous": "yes"}, headers=AUTH)
        assert bad.status_code == 422 and "anonymous" in bad.json()["error"], bad.text
        assert len((await stored(database_url))["facts"]) == 2, "a refused forget removed data"

        done = await http.post("/v1/forget", json={"anonymous": True}, headers=AUTH)
        assert done.status_code == 200, done.text
        assert done.json()["forgotten"] == 2  # a fact and a block
        assert await stored(database_url) == kept

        await seed(http)
    live = settings.model_copy(update={"database_url": database_url})
    cli_both = await asyncio.to_thread(
        memworker, live, "forget", "-p", PROJECT, "--anonymous", "-u", "ann", "--yes"
    )
    assert cli_both.returncode == 2 and "--anonymous" in cli_both.stderr, cli_both.stderr
    ran = await asyncio.to_thread(memworker, live, "forget", "-p", PROJECT, "--anonymous", "--yes")
    assert ran.returncode == 0, ran.stderr
    assert "the anonymous user" in ran.stdout and "facts" in ran.stdout, ran.stdout
    assert await stored(database_url) == kept


async def test_forgetting_the_whole_project_takes_every_users_facts_and_blocks_export_lists_them(
    api: tuple[str, Memworker], redis: Redis, settings: Settings, database_url: str
) -> None:
    """``memworker forget -p P`` is documented as the whole project going: the facts, blocks
    and change-feed rows of every user and of none go too (they stayed before), and
    ``memworker export -p P`` lists them first."""
    base, _ = api
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        await seed(http)
    live = settings.model_copy(update={"database_url": database_url})
    exported = await asyncio.to_thread(memworker, live, "export", "-p", PROJECT)
    assert exported.returncode == 0, exported.stderr
    document = orjson.loads(exported.stdout)
    assert sorted(f["object"] for f in document["facts"]) == ["PII-None", "PII-ann"]
    assert sorted(b["content"] for b in document["memory_blocks"]) == ["BLOCK-None", "BLOCK-ann"]
    ran = await asyncio.to_thread(memworker, live, "forget", "-p", PROJECT, "--yes")
    assert ran.returncode == 0, ran.stderr
    assert await stored(database_url) == {"facts": [], "blocks": []}
    async with migrated_engine(database_url) as engine, engine.connect() as conn:
        changes = await conn.scalar(
            sql("SELECT count(*) FROM memory_changes WHERE project_id = :p"), {"p": PROJECT}
        )
    assert changes == 0
