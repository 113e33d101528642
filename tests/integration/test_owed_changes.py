"""A ``serve`` whose Redis is down still answers ``remember`` 200: the turns' change events
are owed in Postgres (``memory_changes``), not lost, and the consolidator publishes them once
Redis is back though the project makes no change since. Before, they waited for that
project's next change (a project that never changed again kept them owed for ever)."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
from redis.asyncio import Redis
from sqlalchemy import text

from tests.integration.test_access import TOKEN, migrated
from tests.security.processes import Recorded, clean_env, free_port
from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.keys import changes_stream
from worker.settings import Settings

PROJECT = "owed-feed"


async def test_changes_owed_while_redis_was_down_are_published_when_it_is_back(
    tmp_path: Path, redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await migrated(settings, database_url)
    env = clean_env(
        DATABASE_URL=database_url,
        MEMWORKER_STREAM_PREFIX=settings.stream_prefix,
        MEMWORKER_API_TOKEN=TOKEN,
    )  # REDIS_URL: a port nothing listens on
    port = free_port()
    serve = Recorded(
        ["serve", "-p", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env, tmp_path / "s"
    )
    try:
        serve.wait_for("memory API of project")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=120, headers=headers
        ) as http:
            for n in range(3):
                body = {"user_id": "ann", "session_id": "c1", "input": f"q{n}", "output": "a"}
                got = await http.post("/v1/remember", json=body)
                assert got.status_code == 200, got.text
    finally:
        serve.finish()

    engine = create_database_engine(database_url)
    try:
        async with engine.connect() as conn:
            owed = (await conn.execute(text("SELECT count(*) FROM memory_changes"))).scalar()
        assert owed is not None and owed >= 3  # owed (one a turn at least), not lost
        consolidator = Consolidator(settings, redis, engine)
        await consolidator.tick()
        async with engine.connect() as conn:
            owed = (await conn.execute(text("SELECT count(*) FROM memory_changes"))).scalar()
        assert owed == 0
    finally:
        await engine.dispose()
    stream = changes_stream(settings.stream_prefix, PROJECT, settings.shards)
    entries = await redis.xrange(stream)
    events = [
        orjson.loads(fields[b"event"] if b"event" in fields else next(iter(fields.values())))
        for _id, fields in entries
    ]
    remembered = [e for e in events if e["type"] == "episode.remembered"]
    assert len(remembered) == 3 and {e["user_id"] for e in remembered} == {"ann"}
