"""``.`` and ``..`` are no ids: the inspector links a user at ``/ui/users/<id>``, and a browser
drops those path steps (``/ui/users/..`` is ``/ui/``), so such a user could not be reached or
forgotten there. Before, ``remember`` and ``update_block`` took them as a user, session or block
id; now each is a 422 naming the field over HTTP, an ``InvalidInputError`` in Python, and nothing
is stored. (Every id field of every route and tool is sent them by ``test_hostile_fields``.)"""

from __future__ import annotations

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from schemas.inputs import InvalidInputError
from tests.inspector_server import TOKEN, env_for, serving
from tests.integration.results_factory import migrated_engine
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

AUTH = {"Authorization": f"Bearer {TOKEN}"}
TURN = {"user_id": "ann", "session_id": "chat", "input": "hello", "output": "hi"}


async def _stored(database_url: str) -> list[str]:
    engine = create_async_engine(database_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT user_id FROM episodes UNION ALL SELECT name FROM memory_blocks")
            )
            return [r[0] for r in rows]
    finally:
        await engine.dispose()


async def test_dot_and_dot_dot_are_refused_as_ids_naming_the_field(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    with serving(env_for(settings, database_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=AUTH) as http:
            for dots in (".", ".."):
                for tool, body, field in (
                    ("remember", TURN, "user_id"),
                    ("remember", TURN, "session_id"),
                    ("update_block", {"user_id": "ann", "name": "p", "content": "x"}, "name"),
                    ("update_block", {"user_id": "ann", "name": "p", "content": "x"}, "user_id"),
                ):
                    got = await http.post(f"/v1/{tool}", json={**body, field: dots})
                    assert got.status_code == 422, (tool, field, dots, got.text)
                    assert field in got.json()["error"], got.text
    settings = settings.model_copy(update={"database_url": database_url})
    async with Memory("dots", settings=settings, redis=redis) as memory:
        for dots in (".", ".."):
            with pytest.raises(InvalidInputError, match="user_id"):
                await memory.remember(Episode(**{**TURN, "user_id": dots}))
            with pytest.raises(InvalidInputError, match="name"):
                await memory.update_block(dots, "x", user_id="ann")
    assert await _stored(database_url) == []
