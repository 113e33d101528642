"""Forget means forgotten (issue 23): `memworker forget` and `export`, with traffic running.

Two projects are seeded; one is forgotten while the lifecycle worker, the consolidator and the
indexer run and commands for both still arrive. Then every Redis key and stream entry under
the prefix and every row of every table is scanned for the forgotten project's content, every
replay path is run, and nothing comes back; the other project is intact and recallable.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import text as sql

from schemas.streams import MemoryForgotten
from tests.helpers import running_worker, wait_until
from tests.integration.test_client_and_cli import memworker
from worker.codec import text
from worker.consolidation.consolidator import Consolidator
from worker.consolidation.replay import (
    ResultRange,
    replay_results_from_postgres,
    replay_results_from_stream,
)
from worker.consumers.dead_letters import redrive, write_dead_letters
from worker.db.engine import create_database_engine
from worker.db.migrate import migrate
from worker.episodes.indexer import Indexer, indexer_dlq
from worker.episodes.store import EpisodeStore
from worker.erasure.erased import load_erased
from worker.keys import StreamKeys, episodes_stream, erased_key, shard_of
from worker.lifecycle.client import LifecycleClient
from worker.lifecycle.replay import replay_lifecycle
from worker.memory import SessionForgottenError, WorkingMemory
from worker.settings import Settings

GONE, KEPT = "gone", "kept"
SECRET = b"SECRET-gone"  # in every piece of content of the forgotten project
FINISHED, LIVE = 6, 3


@pytest.fixture
async def live(settings: Settings, database_url: str) -> Settings:
    await migrate(database_url)
    return settings.model_copy(update={"database_url": database_url, "shards": 2})


def secret(project: str, n: int) -> str:
    return f"SECRET-{project}-{n}" if project == GONE else f"keep-{project}-{n} rainbow"


async def seed(client: LifecycleClient, project: str) -> None:
    """FINISHED consolidated sessions and LIVE paused ones (variables and a checkpoint)."""
    for n in range(FINISHED + LIVE):
        s = f"s{n}"
        state = {"note": secret(project, n)}
        await client.wait(await client.spawn(project, s, "a", state), timeout=10)
        await client.wait(
            await client.pause(project, s, "a", description=secret(project, n)), timeout=10
        )
        if n < FINISHED:
            await client.wait(await client.resume(project, s, "a"), timeout=10)
            sent = await client.terminate(
                project,
                s,
                "a",
                task_description=f"task {secret(project, n)}",
                lessons_learned=[f"lesson {secret(project, n)}"],
                metadata={"note": secret(project, n)},
            )
            await client.wait(sent, timeout=10)


@contextlib.asynccontextmanager
async def services(settings: Settings) -> AsyncIterator[tuple[Consolidator, Indexer]]:
    """The consolidator and the indexer running in this event loop."""
    stop = asyncio.Event()
    consolidator = Consolidator.from_settings(settings, block_ms=50)
    indexer = Indexer.from_settings(settings, block_ms=50)
    tasks = [asyncio.create_task(consolidator.run(stop)), asyncio.create_task(indexer.run(stop))]
    try:
        yield consolidator, indexer
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await consolidator.close()
        await indexer.close()


async def traffic(redis: Redis, settings: Settings, stop: asyncio.Event) -> int:
    """Commands for both projects until ``stop``: new kept sessions, and pauses and resumes
    of the forgotten project's live sessions (with content in their metadata)."""
    client = LifecycleClient(redis, settings)
    n = 0
    while not stop.is_set():
        await client.spawn(KEPT, f"t{n}", "a", {"note": f"keep-traffic-{n}"})
        await client.terminate(KEPT, f"t{n}", "a", task_description=f"traffic {n} rainbow")
        s = f"s{FINISHED + n % LIVE}"
        await client.resume(GONE, s, "a", metadata={"note": f"SECRET-gone-traffic-{n}"})
        await client.pause(GONE, s, "a", description=f"SECRET-gone-traffic-{n}")
        n += 1
        await asyncio.sleep(0.01)
    return n


async def drained(redis: Redis, settings: Settings) -> None:
    """Every group of every stream has read and acknowledged everything."""

    async def done() -> bool:
        streams = [StreamKeys(settings.stream_prefix, i) for i in range(settings.shards)]
        names = [k.lifecycle for k in streams] + [k.results for k in streams]
        names.append(episodes_stream(settings.stream_prefix))
        for name in names:
            if not await redis.exists(name):
                continue
            for group in await redis.xinfo_groups(name):
                if group["pending"] or group.get("lag"):
                    return False
        return True

    await wait_until(done, timeout=60, every=0.2)


async def redis_copies(redis: Redis, prefix: str) -> list[tuple[str, bytes]]:
    """Every key under the prefix with its whole content, stream entries one by one."""
    found: list[tuple[str, bytes]] = []
    async for raw in redis.scan_iter(match=f"{prefix}:*", count=1000):
        key = text(raw)
        kind = text(await redis.type(raw))
        if kind == "stream":
            rows: Any = await redis.xrange(raw)
            found += [
                (
                    f"{key} {i.decode()}",
                    orjson.dumps({k.decode(): v.decode() for k, v in f.items()}),
                )
                for i, f in rows
            ]
        elif kind == "hash":
            found.append((key, repr(await redis.hgetall(raw)).encode()))  # type: ignore[misc]
        elif kind == "string":
            value: Any = await redis.get(raw)
            found.append((key, value or b""))
        elif kind == "list":
            found.append((key, repr(await redis.lrange(raw, 0, -1)).encode()))  # type: ignore[misc]
        elif kind in ("zset", "set"):
            found.append(
                (
                    key,
                    repr(
                        await redis.zrange(raw, 0, -1)
                        if kind == "zset"
                        else await redis.smembers(raw)  # type: ignore[misc]
                    ).encode(),
                )
            )
    return found


async def table_copies(settings: Settings) -> dict[str, list[str]]:
    """Every row of every table of the database, as JSON text."""
    engine = create_database_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            tables = [
                r[0]
                for r in await conn.execute(
                    sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
                )
            ]
            return {
                t: [
                    str(r[0])
                    for r in await conn.execute(sql(f'SELECT row_to_json(x)::text FROM "{t}" x'))
                ]
                for t in tables
            }
    finally:
        await engine.dispose()


def assert_nothing_of_the_forgotten(
    keys: list[tuple[str, bytes]], rows: dict[str, list[str]]
) -> None:
    leaks = [name for name, content in keys if SECRET in content]
    assert not leaks, leaks[:5]
    for table, values in rows.items():
        leaked = [v[:200] for v in values if SECRET.decode() in v]
        assert not leaked, (table, leaked[:3])
    assert not [v for v in rows["episodes"] if f'"project_id":"{GONE}"' in v]
    assert not [v for v in rows["lifecycle_events"] if f'"project_id":"{GONE}"' in v]
    # Of the forgotten sessions' keys only their markers are left (state and a time).
    for name, content in keys:
        if f":s:{GONE}/".encode() in name.encode():
            assert name.endswith(":meta") and b"forgotten" in content, name
    # What still names the project carries ids and times only: the erasure record, the
    # forgotten sessions' markers, the memory.forgotten event and the `forgotten` rejections.
    for name, content in keys:
        if f'"project_id":"{GONE}"'.encode() in content or f"/{GONE}/".encode() in content:
            body = orjson.loads(orjson.loads(content)["data"])
            assert body["type"] == "memory.forgotten" or body.get("reason") == "forgotten", name
            assert "metadata" not in body and "correlation_id" not in body, name


async def test_forget_under_traffic_leaves_no_copy_and_no_replay_brings_it_back(
    redis: Redis, live: Settings
) -> None:
    client = LifecycleClient(redis, live)
    prefix = live.stream_prefix
    async with running_worker(live), services(live):
        await seed(client, GONE)
        await seed(client, KEPT)
        # A dead letter of the forgotten project, and a copy a replay published under the prefix
        gone_command = {
            "type": "pause",
            "event_id": "dl-1",
            "project_id": GONE,
            "session_id": "s0",
            "agent_instance_id": "a",
            "description": "SECRET-gone-dead-letter",
        }
        shard = shard_of(GONE, "s0", live.shards)
        keys = StreamKeys(prefix, shard)
        await write_dead_letters(
            redis,
            "lifecycle",
            lambda _s: keys.dlq,
            [(keys.lifecycle, "1-1", {"data": orjson.dumps(gone_command)}, "seq_gap", "test")],
        )
        await drained(redis, live)
        for i in range(live.shards):
            await replay_results_from_stream(redis, live, i, ResultRange(), f"{prefix}:copies")
        store_engine = create_database_engine(live.database_url)
        store = EpisodeStore(store_engine)
        assert len(await store.list_episodes(GONE)) == FINISHED
        kept_before = {e.session_id for e in await store.list_episodes(KEPT)}

        stop = asyncio.Event()
        sending = asyncio.create_task(traffic(redis, live, stop))
        await asyncio.sleep(0.5)
        done = await asyncio.to_thread(memworker, live, "forget", "--project", GONE, "--yes")
        await asyncio.sleep(0.5)  # commands for the forgotten sessions keep arriving
        stop.set()
        sent = await sending
        assert sent > 5
        await drained(redis, live)

    assert done.returncode == 0, done.stderr
    receipt = done.stdout
    assert f"forgot project {GONE}" in receipt
    assert f"postgres episodes: {FINISHED}" in receipt
    assert "redis sessions_marked:" in receipt and f"stream {prefix}:copies:" in receipt

    # Every replay path, then the scan.
    for i in range(live.shards):
        counts = await replay_lifecycle(redis, live, i)
        assert counts["applied"] == 0, counts  # the forgotten project's commands are gone
        await replay_results_from_stream(redis, live, i, ResultRange(), f"{prefix}:replayed")
    await replay_results_from_postgres(
        redis, live, list(range(live.shards)), ResultRange(), f"{prefix}:replayed"
    )
    for i in range(live.shards):
        await redrive(redis, StreamKeys(prefix, i).dlq, None, await load_erased(redis, prefix))
    consolidator = Consolidator.from_settings(live)
    try:
        await consolidator.run_once()
    finally:
        await consolidator.close()

    assert_nothing_of_the_forgotten(await redis_copies(redis, prefix), await table_copies(live))
    assert await store.list_episodes(GONE) == []
    assert not await redis.exists(indexer_dlq(prefix))  # memory.forgotten is no poison
    entries: Any = await redis.xrange(episodes_stream(prefix))
    events = [orjson.loads(f[b"data"]) for _i, f in entries]
    forgotten = [e for e in events if e["type"] == "memory.forgotten"]
    assert len(forgotten) == 1 and forgotten[0]["counts"]["postgres"]["episodes"] == FINISHED
    event = MemoryForgotten.model_validate(forgotten[0])  # the contract's model
    assert event.project_id == GONE and event.session_id is None and event.complete

    # The other project: intact and recallable.
    kept_after = {e.session_id for e in await store.list_episodes(KEPT, limit=1000)}
    assert kept_before <= kept_after
    assert len(kept_after) == FINISHED + sent  # every kept session the traffic ended: nothing lost
    hits = await store.recall(KEPT, "rainbow lesson", mode="text")
    assert hits and all(h.episode.project_id == KEPT for h in hits)
    memory = await WorkingMemory.for_session(f"s{FINISHED}", KEPT, redis=redis, settings=live)
    assert await memory.get("note") == secret(KEPT, FINISHED)
    await store_engine.dispose()


async def test_a_forgotten_session_rejects_later_commands_and_writes_and_backups_stay_out(
    redis: Redis, live: Settings
) -> None:
    client = LifecycleClient(redis, live)
    prefix = live.stream_prefix
    engine = create_database_engine(live.database_url)
    store = EpisodeStore(engine)
    async with running_worker(live):
        await seed(client, GONE)
        consolidator = Consolidator.from_settings(live)
        try:
            await consolidator.run_once()
        finally:
            await consolidator.close()
        # What a backup holds: the results as they were before the forget.
        exported = await store.export(GONE, redis=redis, prefix=prefix)
        backup = [
            (stream, entry)
            for stream, entries in exported.stream_entries.items()
            if ":results:" in stream
            for entry in entries
        ]
        assert len(backup) >= FINISHED and exported.working_memory

        result = await store.forget(GONE, session_id="s7", redis=redis, prefix=prefix)
        assert result.receipt is not None and result.receipt.ok
        result = await store.forget(GONE, redis=redis, prefix=prefix)
        assert result.episodes == FINISHED

        late = await client.pause(GONE, "s7", "a", metadata={"note": "SECRET-gone-late"})
        answer = await client.wait(late, timeout=10)
        assert answer.type == "command.rejected" and answer.reason == "forgotten"
        assert answer.metadata is None
        memory = await WorkingMemory.for_session("s8", GONE, redis=redis, settings=live)
        with pytest.raises(SessionForgottenError):
            await memory.set("note", "SECRET-gone-after")

    # A restored backup puts old results back in the stream: nothing of them is stored again,
    # nor republished by a replay.
    for stream, entry in backup:
        await redis.xadd(
            stream, {k: v if isinstance(v, str) else str(v) for k, v in entry["fields"].items()}
        )
    republished = f"{prefix}:republished"
    counts = {}
    for i in range(live.shards):
        counts[i] = await replay_results_from_stream(redis, live, i, ResultRange(), republished)
    assert sum(c["forgotten"] for c in counts.values()) >= len(backup)
    copies: Any = await redis.xrange(republished)
    assert all(orjson.loads(f[b"data"]).get("reason") == "forgotten" for _i, f in copies)
    consolidator = Consolidator.from_settings(live)
    try:
        await consolidator.run_once()
    finally:
        await consolidator.close()
    rows = await table_copies(live)
    assert not [v for v in rows["episodes"] + rows["lifecycle_events"] if SECRET.decode() in v]
    assert [r for r in rows["erasures"] if '"session_id":null' in r]
    assert all(SECRET.decode() not in r for r in rows["erasures"])

    # A Redis restored without P:erased but with an old dead letter: the consolidator copies
    # the record back from Postgres, and the redrive drops the letter instead of replaying it.
    await redis.delete(erased_key(prefix))
    keys = StreamKeys(prefix, shard_of(GONE, "s0", live.shards))
    old_command = {
        "type": "pause",
        "event_id": "old-1",
        "project_id": GONE,
        "session_id": "s0",
        "agent_instance_id": "a",
        "description": "SECRET-gone-restored",
    }
    await write_dead_letters(
        redis,
        "lifecycle",
        lambda _s: keys.dlq,
        [(keys.lifecycle, "1000-0", {"data": orjson.dumps(old_command)}, "seq_gap", "test")],
    )
    consolidator = Consolidator.from_settings(live)
    try:
        assert await consolidator.sync_erased() == 2  # the session's forget and the project's
    finally:
        await consolidator.close()
    before = await redis.xlen(keys.lifecycle)
    assert await redrive(redis, keys.dlq, None, await load_erased(redis, prefix)) == 0
    assert await redis.xlen(keys.dlq) == 0
    assert await redis.xlen(keys.lifecycle) == before
    # ... and a restored command stream is not applied again by a replay.
    await redis.delete(keys.lifecycle)
    await redis.xadd(keys.lifecycle, {"data": orjson.dumps(old_command)}, id="1000-0")
    assert await replay_lifecycle(redis, live, keys.shard) == {"forgotten": 1}
    await engine.dispose()


async def test_forget_dry_run_export_and_an_incomplete_forget_through_the_cli(
    redis: Redis, live: Settings, tmp_path: Any
) -> None:
    client = LifecycleClient(redis, live)
    async with running_worker(live):
        await seed(client, GONE)
    consolidator = Consolidator.from_settings(live)
    try:
        await consolidator.run_once()
    finally:
        await consolidator.close()
    before = await redis_copies(redis, live.stream_prefix)

    dry = await asyncio.to_thread(memworker, live, "forget", "-p", GONE, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith(f"would forget project {GONE}")
    assert f"postgres episodes: {FINISHED}" in dry.stdout
    assert await redis_copies(redis, live.stream_prefix) == before

    out = tmp_path / "export.json"
    done = await asyncio.to_thread(memworker, live, "export", "-p", GONE, "--out", str(out))
    assert done.returncode == 0, done.stderr
    document = orjson.loads(out.read_bytes())
    assert len(document["episodes"]) == FINISHED
    assert document["lifecycle_events"] and document["stream_entries"]
    memory = document["working_memory"]  # live sessions' keys; finished ones' tombstones
    assert sorted(s for s, kinds in memory.items() if "vars" in kinds) == [
        f"s{n}" for n in range(FINISHED, FINISHED + LIVE)
    ]
    assert memory[f"s{FINISHED}"]["vars"]["note"] == f'"{secret(GONE, FINISHED)}"'

    piped = await asyncio.to_thread(memworker, live, "export", "-p", GONE, "--before", "0s")
    assert piped.returncode == 0, piped.stderr
    older = orjson.loads(piped.stdout)  # stdout is the document alone (no progress off a tty)
    assert len(older["episodes"]) == FINISHED and older["working_memory"] == {}
    assert sum(map(len, older["stream_entries"].values())) == sum(
        map(len, document["stream_entries"].values())
    )  # --before still exports the stream entries forget --before would delete

    broken = live.model_copy(update={"database_url": "postgresql://nobody@127.0.0.1:1/none"})
    failed = await asyncio.to_thread(memworker, broken, "forget", "-p", GONE, "--yes")
    assert failed.returncode == 1
    [line] = failed.stderr.strip().splitlines()
    assert line.startswith("memworker: error: forget is incomplete: postgres:")
    assert "it is owed (recorded in redis)" in line  # Postgres could not keep the record
