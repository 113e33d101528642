"""Helpers shared by the integration and acceptance suites."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.keys import StreamKeys, shard_of
from worker.lifecycle.worker import LifecycleWorker
from worker.settings import Settings


def command(
    kind: str, event_id: str, session: str = "s1", project: str = "p1", **fields: Any
) -> dict[str, Any]:
    return {
        "type": kind,
        "event_id": event_id,
        "project_id": project,
        "session_id": session,
        "agent_instance_id": "agent-1",
        **fields,
    }


async def publish(
    redis: Redis, settings: Settings, body: Mapping[str, Any] | bytes, shard: int | None = None
) -> str:
    """XADD a command (a dict as JSON, or raw bytes) to its shard's lifecycle stream."""
    if shard is None:
        assert isinstance(body, Mapping)
        shard = shard_of(str(body["project_id"]), str(body["session_id"]), settings.shards)
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    entry_id = await redis.xadd(StreamKeys(settings.stream_prefix, shard).lifecycle, {"data": data})
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


async def results(redis: Redis, settings: Settings, shard: int = 0) -> list[dict[str, Any]]:
    rows: Any = await redis.xrange(StreamKeys(settings.stream_prefix, shard).results)
    return [orjson.loads(f[b"data"]) for _i, f in rows]


async def all_results(redis: Redis, settings: Settings) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for shard in range(settings.shards):
        out += await results(redis, settings, shard)
    return out


async def dead_letters(redis: Redis, settings: Settings, shard: int = 0) -> list[dict[str, str]]:
    rows: Any = await redis.xrange(StreamKeys(settings.stream_prefix, shard).dlq)
    return [{k.decode(): v.decode() for k, v in f.items()} for _i, f in rows]


async def wait_until(predicate: Any, timeout: float = 20.0, every: float = 0.05) -> None:
    """Poll an async predicate until it is true; fail with a clear message on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if await predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(every)


async def stream_len_at_least(redis: Redis, stream: str, n: int, timeout: float = 30.0) -> None:
    async def enough() -> bool:
        return int(await redis.xlen(stream)) >= n

    await wait_until(enough, timeout)


@contextlib.asynccontextmanager
async def running_worker(
    settings: Settings, consumer: str | None = None
) -> AsyncIterator[LifecycleWorker]:
    """A lifecycle worker running in this event loop for the duration of the block."""
    worker = LifecycleWorker(settings, consumer=consumer)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await wait_until(_ready(worker, task), timeout=20)
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=20)


def _ready(worker: LifecycleWorker, task: asyncio.Task[None]) -> Any:
    async def check() -> bool:
        if task.done():
            task.result()
        return worker.ready

    return check


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "REDIS_URL": settings.redis_url,
            "DATABASE_URL": settings.database_url,
            "MEMWORKER_STREAM_PREFIX": settings.stream_prefix,
            "MEMWORKER_SHARDS": str(settings.shards),
            "MEMWORKER_LOG_JSON": "true",
            "MEMWORKER_LOG_LEVEL": "WARNING",
            **extra,
        }
    )
    return env


@contextlib.contextmanager
def worker_process(
    settings: Settings, *args: str, **extra: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``memworker run`` as a subprocess (as a process manager would run it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "run", *args],
        env=worker_env(settings, **extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr:
            proc.stderr.close()


async def spawn_session(
    redis: Redis, settings: Settings, project: str, session: str, user_id: str | None = None
) -> None:
    """Spawn ``session`` the real way (a spawn command applied by a lifecycle worker running
    for the call), so the doors that serve only live sessions serve it."""
    from worker.keys import SessionKeys

    fields: dict[str, Any] = {} if user_id is None else {"user_id": user_id}
    meta = SessionKeys.for_session(settings.stream_prefix, settings.shards, project, session).meta
    async with running_worker(settings):
        await publish(
            redis, settings, command("spawn", f"spawn-{session}", session, project, **fields)
        )

        async def live() -> bool:
            return await redis.hget(meta, "state") is not None  # type: ignore[misc]

        await wait_until(live)


@contextlib.asynccontextmanager
async def poison_refused(engine: AsyncEngine) -> AsyncIterator[None]:
    """While in the block, Postgres refuses a turn whose input is ``poison`` (a trigger: it
    stands for whatever data the input rule might miss), with SQLSTATE 22023."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " IF NEW.input = 'poison' THEN RAISE EXCEPTION 'poison refused'"
                " USING ERRCODE = '22023'; END IF; RETURN NEW; END $$"
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER refuse_poison BEFORE INSERT ON episodes"
                " FOR EACH ROW EXECUTE FUNCTION refuse_poison()"
            )
        )
    try:
        yield
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TRIGGER refuse_poison ON episodes"))
            await conn.execute(text("DROP FUNCTION refuse_poison()"))
