"""``memworker serve`` killed (SIGKILL) in the middle of a 50-client burst of ``remember``:
every call that got its 200 is in Postgres once, with its ``episode.remembered`` (on the
change feed, or still owed in the outbox and published by the next ``flush_changes``, never
two different events for one turn); the calls cut off were never acknowledged."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis
from sqlalchemy import text

from tests.cli_process import Memworker
from tests.helpers import worker_env
from tests.integration.results_factory import migrated_engine
from tests.integration.test_access import free_port
from worker.keys import changes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory

PROJECT = "burst"
CLIENTS = 50


async def test_every_acknowledged_remember_survives_a_kill_9_once_with_its_event(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = settings.model_copy(
        update={"database_url": database_url, "remember_embedding": "indexer"}
    )
    async with migrated_engine(database_url) as engine:
        port = free_port()
        env = worker_env(settings, MEMWORKER_REMEMBER_EMBEDDING="indexer")
        server = Memworker(
            ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
        )
        acknowledged: list[str] = []
        enough = asyncio.Event()
        try:
            server.wait_for(f"on http://127.0.0.1:{port}")
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=30, limits=limits
            ) as http:

                async def client(c: int) -> None:
                    n = 0
                    while True:
                        turn = {
                            "id": f"c{c}-{n}",
                            "session_id": f"s{c}",
                            "user_id": f"u{c % 10}",
                            "input": f"turn {n} of client {c}",
                            "output": "ok",
                        }
                        try:
                            reply = await http.post("/v1/remember", json=turn)
                        except httpx.HTTPError:
                            return  # the server is gone: this call was not acknowledged
                        if reply.status_code == 200:
                            acknowledged.append(reply.json()["id"])
                            if len(acknowledged) >= 300:
                                enough.set()
                        n += 1

                clients = [asyncio.create_task(client(c)) for c in range(CLIENTS)]
                await asyncio.wait_for(enough.wait(), 120)
                server.proc.send_signal(signal.SIGKILL)  # mid-burst: 50 calls in flight
                server.proc.wait(timeout=30)
                await asyncio.wait_for(asyncio.gather(*clients), 60)
        finally:
            server.close()
        assert len(acknowledged) >= 300

        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT turn_id, count(*) AS n FROM episodes WHERE project_id = :p GROUP BY 1"
                ),
                {"p": PROJECT},
            )
            stored = {row.turn_id: row.n for row in rows}
        missing = [i for i in acknowledged if i not in stored]
        assert not missing, f"{len(missing)} acknowledged remembers lost: {missing[:5]}"
        assert all(n == 1 for n in stored.values())

        async with Memory(PROJECT, settings=settings, engine=engine, redis=redis) as memory:
            await memory.flush_changes()  # what the kill left owed
        async with engine.connect() as conn:
            owed = await conn.scalar(text("SELECT count(*) FROM memory_changes"))
        assert owed == 0
        entries: Any = await redis.xrange(
            changes_stream(settings.stream_prefix, PROJECT, settings.shards)
        )
        events: dict[str, set[str]] = defaultdict(set)
        for _id, fields in entries:
            event = orjson.loads(fields[b"data"])
            if event["type"] == "episode.remembered":
                events[event["episode_id"]].add(event["event_id"])
        for turn_id in stored:  # acknowledged or not, a stored turn has its one event
            assert len(events.get(turn_id, ())) == 1, (turn_id, events.get(turn_id))
