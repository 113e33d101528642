"""Forget one user (issue 23's `--user`): two users in one project, one forgotten.

The users' sessions go through the real worker and consolidator (spawns naming the user), and
their turns, facts and blocks through ``Memory``. After `memworker forget --user`, every Redis
key and stream entry under the prefix and every row of every table is scanned for the
forgotten user's content, every replay path is run, and nothing comes back; the other user is
intact and still recallable.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from redis.asyncio import Redis

from schemas.streams import MemoryForgotten
from tests.helpers import running_worker
from tests.integration.test_client_and_cli import memworker
from tests.integration.test_forget import drained, live, redis_copies, table_copies
from worker.consolidation.consolidator import Consolidator
from worker.consolidation.replay import (
    ResultRange,
    replay_results_from_postgres,
    replay_results_from_stream,
)
from worker.consumers.dead_letters import redrive, write_dead_letters
from worker.db.engine import create_database_engine
from worker.episodes.store import EpisodeStore
from worker.erasure.erased import load_erased
from worker.keys import StreamKeys, episodes_stream, erased_users_key, shard_of
from worker.lifecycle.client import LifecycleClient
from worker.lifecycle.replay import replay_lifecycle
from worker.memory import WorkingMemory
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Fact

PROJECT = "users"
ANN, BOB = "ann", "bob"  # ann is forgotten, bob kept
SECRET = "SECRET-ann"
FINISHED, LIVE = 3, 2
RETURNED = f"{ANN}-new"  # ann's session after the forget: a new one, kept
__all__ = ["live"]  # the project forget tests' fixture: migrated, two shards


def content(user: str, n: int) -> str:
    return f"{SECRET}-{n}" if user == ANN else f"keep-{user}-{n} rainbow"


async def seed_sessions(client: LifecycleClient, user: str) -> None:
    """FINISHED consolidated sessions and LIVE paused ones of the user."""
    for n in range(FINISHED + LIVE):
        s = f"{user}-s{n}"
        state = {"note": content(user, n)}
        await client.wait(await client.spawn(PROJECT, s, "a", state, user_id=user), timeout=10)
        await client.wait(
            await client.pause(PROJECT, s, "a", description=content(user, n)), timeout=10
        )
        if n < FINISHED:
            await client.wait(await client.resume(PROJECT, s, "a"), timeout=10)
            sent = await client.terminate(
                PROJECT,
                s,
                "a",
                task_description=f"task {content(user, n)}",
                lessons_learned=[f"lesson {content(user, n)}"],
            )
            await client.wait(sent, timeout=10)


async def seed_memory(memory: Memory, user: str) -> None:
    """Turns, a fact and a block of the user (and the change feed's entries of them)."""
    for n in range(2):
        await memory.remember(
            Episode(
                session_id=f"{user}-chat",
                user_id=user,
                input=f"question {content(user, n)}",
                output=f"answer {content(user, n)}",
            )
        )
    await memory.facts.append(
        Fact(user_id=user, subject=user, predicate="likes", object=content(user, 9))
    )
    await memory.update_block("persona", f"persona {content(user, 8)}", user_id=user)
    await memory.flush_changes()


def ann_anywhere(keys: list[tuple[str, bytes]], rows: dict[str, list[str]]) -> list[str]:
    """Where the forgotten user's content, or data naming the user, is still kept (the erasure
    record, the memory.forgotten events and the `forgotten` rejections hold ids only)."""
    leaks = [name for name, value in keys if SECRET.encode() in value]
    leaks += [f"{t}: {v[:120]}" for t, values in rows.items() for v in values if SECRET in v]
    for name, value in keys:
        if name.endswith((":erased", ":erased_users")) or RETURNED.encode() in value:
            continue
        if RETURNED in name:
            continue
        if f":s:{PROJECT}/{ANN}-".encode() in name.encode():
            if not (name.endswith(":meta") and b"forgotten" in value):
                leaks.append(name)
            continue
        if b'"user_id":"ann"' in value or f"/{ANN}-s".encode() in value:
            body = orjson.loads(orjson.loads(value)["data"])
            if body["type"] != "memory.forgotten" and body.get("reason") != "forgotten":
                leaks.append(name)
    for table, values in rows.items():
        if table == "erasures":
            continue
        values = [v for v in values if RETURNED not in v]  # ann's new session, after it
        leaks += [f"{table}: {v[:120]}" for v in values if '"user_id":"ann"' in v]
        leaks += [f"{table}: {v[:120]}" for v in values if '"user_key":"ann"' in v]
    return leaks


async def replay_everything(redis: Redis, live: Settings) -> None:
    prefix = live.stream_prefix
    for i in range(live.shards):
        counts = await replay_lifecycle(redis, live, i)
        assert counts["applied"] == 0, counts
        await replay_results_from_stream(redis, live, i, ResultRange(), f"{prefix}:replayed")
    await replay_results_from_postgres(
        redis, live, list(range(live.shards)), ResultRange(), f"{prefix}:replayed"
    )
    for i in range(live.shards):
        await redrive(redis, StreamKeys(prefix, i).dlq, None, await load_erased(redis, prefix))
    consolidator = Consolidator.from_settings(live)
    try:
        await consolidator.run_once()
        await consolidator.sync_erased()
    finally:
        await consolidator.close()


async def test_forget_one_user_leaves_no_copy_and_keeps_the_other(
    redis: Redis, live: Settings
) -> None:
    client = LifecycleClient(redis, live)
    prefix = live.stream_prefix
    engine = create_database_engine(live.database_url)
    store = EpisodeStore(engine)
    memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
    try:
        async with running_worker(live):
            await seed_sessions(client, ANN)
            await seed_sessions(client, BOB)
            await seed_memory(memory, ANN)
            await seed_memory(memory, BOB)
            # A dead letter of ann's: her spawn's command, with content.
            shard = shard_of(PROJECT, f"{ANN}-s0", live.shards)
            keys = StreamKeys(prefix, shard)
            letter = {
                "type": "spawn",
                "event_id": "dl-ann",
                "project_id": PROJECT,
                "session_id": f"{ANN}-s9",
                "agent_instance_id": "a",
                "user_id": ANN,
                "initial_state": {"note": f"{SECRET}-dead-letter"},
            }
            await write_dead_letters(
                redis,
                "lifecycle",
                lambda _s: keys.dlq,
                [(keys.lifecycle, "1-1", {"data": orjson.dumps(letter)}, "seq_gap", "test")],
            )
            consolidator = Consolidator.from_settings(live)
            try:
                await consolidator.run_once()
            finally:
                await consolidator.close()
            await drained(redis, live)
            assert len(await store.list_episodes(PROJECT, user_id=ANN)) == FINISHED + 2

            exported = await asyncio.to_thread(
                memworker, live, "export", "-p", PROJECT, "--user", ANN
            )
            assert exported.returncode == 0, exported.stderr
            document = orjson.loads(exported.stdout)
            assert document["user_id"] == ANN
            assert len(document["episodes"]) == FINISHED + 2
            assert all(e["user_id"] == ANN for e in document["episodes"])
            assert len(document["facts"]) == 1 and len(document["memory_blocks"]) == 1
            held = document["working_memory"]
            assert sorted(held) == [f"{ANN}-s{n}" for n in range(FINISHED + LIVE)]
            finished = sorted(s for s in held if held[s]["meta"]["state"] == "terminated")
            assert finished == [f"{ANN}-s{n}" for n in range(FINISHED)]  # tombstones: no memory
            assert all(set(held[s]) == {"meta"} for s in finished)
            assert BOB not in exported.stdout.replace('"bob"', "")  # nothing of bob's
            assert "keep-bob" not in exported.stdout

            dry = await asyncio.to_thread(
                memworker, live, "forget", "-p", PROJECT, "--user", ANN, "--dry-run"
            )
            assert dry.returncode == 0, dry.stderr
            assert dry.stdout.startswith(f"would forget project {PROJECT}, user {ANN}")

            done = await asyncio.to_thread(
                memworker, live, "forget", "-p", PROJECT, "-u", ANN, "--yes"
            )
            assert done.returncode == 0, done.stderr
            receipt = done.stdout
            assert f"forgot project {PROJECT}, user {ANN}" in receipt
            assert f"postgres episodes: {FINISHED + 2}" in receipt
            assert "postgres facts: 1" in receipt and "postgres memory_blocks: 1" in receipt
            assert f"redis sessions_marked: {FINISHED + LIVE + 1}" in receipt, receipt

            # A command for ann's live session is rejected `forgotten`; her working memory too.
            late = await client.pause(PROJECT, f"{ANN}-s{FINISHED}", "a", description="x")
            answer = await client.wait(late, timeout=10)
            assert answer.type == "command.rejected" and answer.reason == "forgotten"
            # A spawn naming a user forgotten while it was in flight (published before the
            # cutoff: here, a cutoff in the future) is rejected `forgotten` as well.
            future = int(time.time() * 1000) + 60_000
            for i in range(live.shards):
                await redis.hset(erased_users_key(prefix, i), f"{PROJECT}@carol", str(future))  # type: ignore[misc]
            early = await client.spawn(PROJECT, "carol-s0", "a", {"n": 1}, user_id="carol")
            answer = await client.wait(early, timeout=10)
            assert answer.type == "command.rejected" and answer.reason == "forgotten"
            for i in range(live.shards):
                await redis.hdel(erased_users_key(prefix, i), f"{PROJECT}@carol")  # type: ignore[misc]
            # ann coming back later is a new user: her new session is hers, and kept.
            back = await client.spawn(PROJECT, RETURNED, "a", {"n": 1}, user_id=ANN)
            assert (await client.wait(back, timeout=10)).type == "agent.spawned"
            await client.wait(await client.terminate(PROJECT, RETURNED, "a"), timeout=10)

        await replay_everything(redis, live)
        leaks = ann_anywhere(await redis_copies(redis, prefix), await table_copies(live))
        assert not leaks, leaks[:5]
        ann_now = await store.list_episodes(PROJECT, user_id=ANN)
        assert [e.session_id for e in ann_now] == [RETURNED]  # after the cutoff: kept
        events: Any = await redis.xrange(episodes_stream(prefix))
        forgotten = [
            orjson.loads(f[b"data"])
            for _i, f in events
            if orjson.loads(f[b"data"])["type"] == "memory.forgotten"
        ]
        assert len(forgotten) == 1
        event = MemoryForgotten.model_validate(forgotten[0])
        assert event.user_id == ANN and event.session_id is None and event.complete
        assert event.counts["postgres"]["episodes"] == FINISHED + 2

        # bob: intact and recallable.
        bob = await store.list_episodes(PROJECT, user_id=BOB)
        assert len(bob) == FINISHED + 2
        hits = await store.recall(PROJECT, "rainbow lesson", mode="text", user_id=BOB)
        assert hits and all(h.episode.user_id == BOB for h in hits)
        turns = await memory.recall("rainbow answer", user_id=BOB)
        assert turns and all(t.user_id == BOB for t in turns)
        assert [f.object for f in await memory.recall_facts("rainbow", user_id=BOB)] == [
            content(BOB, 9)
        ]
        assert [b.name for b in await memory.working(user_id=BOB)] == ["persona"]
        wm = await WorkingMemory.for_session(
            f"{BOB}-s{FINISHED}", PROJECT, redis=redis, settings=live
        )
        assert await wm.get("note") == content(BOB, FINISHED)
        copies = await redis_copies(redis, prefix)
        assert any(b"keep-bob" in value for _name, value in copies)
    finally:
        await memory.close()
        await engine.dispose()
