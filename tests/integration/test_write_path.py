"""The write path under many agents: ``remember`` from 50 concurrent writers of one project
keeps each user's change feed in commit order, every turn stored once with one event;
``remember_many`` stores a batch once with its events, idempotently, or refuses it whole;
what one ``Memory`` remembered the next call through another finds at once."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.inputs import InvalidInputError
from schemas.limits import MAX_REMEMBER_BATCH
from tests.cli_process import Memworker
from tests.helpers import poison_refused, worker_env
from tests.integration.test_access import free_port
from worker.keys import changes_stream, episodes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Message, ToolCall
from worker.user_memory.turns import EpisodeConflictError
from worker.user_memory.writes import BatchTooLargeError

PROJECT = "agents"


def turn(turn_id: str, user: str, text_: str = "booked the train to porto") -> Episode:
    return Episode(id=turn_id, session_id=f"s-{user}", user_id=user, input=text_, output="ok")


async def feed(
    redis: Redis, settings: Settings, kind: str = "episode.remembered"
) -> list[dict[str, Any]]:
    stream = changes_stream(settings.stream_prefix, PROJECT, settings.shards)
    entries: Any = await redis.xrange(stream)
    events = [orjson.loads(f[b"data"]) for _id, f in entries]
    return [e for e in events if e["type"] == kind and e["project_id"] == PROJECT]


async def counts(engine: AsyncEngine) -> tuple[int, int]:
    """(turns of the project, change events still owed)."""
    async with engine.connect() as conn:
        turns = await conn.scalar(
            text("SELECT count(*) FROM episodes WHERE project_id = :p"), {"p": PROJECT}
        )
        owed = await conn.scalar(text("SELECT count(*) FROM memory_changes"))
    return int(turns or 0), int(owed or 0)


async def test_fifty_concurrent_writers_keep_each_users_feed_in_commit_order(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    """50 users, each one agent writing 12 turns in order, through two ``Memory`` instances
    of the project on engines of their own (two processes' worth: the outbox lock is
    contended across them)."""
    users, each = 50, 12
    async with (
        Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as one,
        Memory(PROJECT, settings=write_settings, redis=redis) as two,
    ):

        async def agent(u: int) -> None:
            for n in range(each):
                await (one if (u + n) % 2 else two).remember(turn(f"u{u}-{n}", f"u{u}"))

        await asyncio.gather(*(agent(u) for u in range(users)))
    events = await feed(redis, write_settings)
    by_user: dict[str, list[str]] = defaultdict(list)
    for event in events:
        by_user[event["user_id"]].append(event["episode_id"])
    assert len(events) == users * each, "an event lost or doubled"
    for u in range(users):
        assert by_user[f"u{u}"] == [f"u{u}-{n}" for n in range(each)], f"u{u} out of order"
    assert await counts(engine) == (users * each, 0)
    recorded = await redis.xlen(episodes_stream(write_settings.stream_prefix))
    assert recorded == users * each, "every turn announced once to the indexer"
    async with engine.connect() as conn:
        unannounced = await conn.scalar(
            text("SELECT count(*) FROM episodes WHERE announced_at IS NULL")
        )
    assert unannounced == 0


async def test_ten_projects_on_one_engine_share_the_group_commit_and_keep_each_feed(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    """Ten projects' ``Memory`` instances on one engine, five agents each: every turn is on
    its own project's feed once, each user's in order; one project's memory closed midway
    leaves the others writing."""
    projects, users, each = 10, 5, 8
    memories = [
        Memory(f"{PROJECT}{p}", settings=write_settings, engine=engine, redis=redis)
        for p in range(projects)
    ]

    async def agent(p: int, u: int) -> None:
        for n in range(each):
            await memories[p].remember(turn(f"p{p}-u{u}-{n}", f"u{u}"))

    await asyncio.gather(*(agent(p, u) for p in range(projects) for u in range(users)))
    await memories[0].close()
    await asyncio.gather(*(memories[p].remember(turn(f"p{p}-late", "u0")) for p in range(1, 10)))
    for memory in memories[1:]:
        await memory.close()
    for p in range(projects):
        stream = changes_stream(
            write_settings.stream_prefix, f"{PROJECT}{p}", write_settings.shards
        )
        entries: Any = await redis.xrange(stream)
        events = [orjson.loads(f[b"data"]) for _id, f in entries]
        mine = [e for e in events if e["project_id"] == f"{PROJECT}{p}"]
        late = [] if p == 0 else [f"p{p}-late"]
        assert len(mine) == users * each + len(late), f"project {p}: an event lost or doubled"
        for u in range(users):
            got = [e["episode_id"] for e in mine if e["user_id"] == f"u{u}"]
            expected = [f"p{p}-u{u}-{n}" for n in range(each)] + (late if u == 0 else [])
            assert got == expected, f"project {p} user u{u} out of order"
    async with engine.connect() as conn:
        stored = await conn.scalar(text("SELECT count(*) FROM episodes"))
        owed = await conn.scalar(text("SELECT count(*) FROM memory_changes"))
    assert (stored, owed) == (projects * users * each + projects - 1, 0)


async def test_remember_many_stores_a_thousand_turns_once_with_a_thousand_events(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    batch = [turn(f"t{k}", f"u{k % 7}", f"turn number {k}") for k in range(1_000)]
    async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
        ids = await memory.remember_many(batch)
        assert ids == [f"t{k}" for k in range(1_000)]
        assert await memory.remember_many(batch) == ids  # a retry of the batch: nothing more
        await memory.remember(batch[500])
    assert await counts(engine) == (1_000, 0)
    events = await feed(redis, write_settings)
    assert [e["episode_id"] for e in events] == ids, "one event each, in batch order"
    assert await redis.xlen(episodes_stream(write_settings.stream_prefix)) == 1_000


async def test_a_batch_repeating_an_id_is_one_turn_and_a_conflict_refuses_it_whole(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
        same = turn("a", "ann")
        assert await memory.remember_many([same, turn("b", "ann"), same]) == ["a", "b", "a"]
        await memory.flush_changes()  # remember_many returns before its events are sent
        assert await counts(engine) == (2, 0)

        with pytest.raises(EpisodeConflictError, match=r"episodes\[2\].*'a'.*episodes\[0\]"):
            await memory.remember_many([same, turn("c", "ann"), turn("a", "ann", "other")])
        with pytest.raises(EpisodeConflictError, match=r"episodes\[1\]: episode 'b'"):
            await memory.remember_many([turn("d", "ann"), turn("b", "ann", "changed")])
        with pytest.raises(EpisodeConflictError, match="already remembered with other content"):
            await memory.remember(turn("a", "ann", "changed"))
    assert await counts(engine) == (2, 0), "a refused batch stores nothing, not even c or d"
    assert [e["episode_id"] for e in await feed(redis, write_settings)] == ["a", "b"]


async def test_two_users_turns_of_one_id_in_a_batch_are_two_events_with_two_event_ids(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    """A batch's events share one time; the event id names the user, so a subscriber dropping
    duplicates by ``event_id`` drops neither (nor those of concurrent ``remember`` calls)."""
    async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
        await asyncio.gather(
            memory.remember_many([turn("t1", "ann"), turn("t1", "bob"), turn("t2", "ann")]),
            memory.remember(turn("t1", "cy")),
            memory.remember(turn("t1", "dee")),
        )
        await memory.flush_changes()
    events = await feed(redis, write_settings)
    assert sorted((e["user_id"], e["episode_id"]) for e in events) == [
        ("ann", "t1"),
        ("ann", "t2"),
        ("bob", "t1"),
        ("cy", "t1"),
        ("dee", "t1"),
    ]
    assert len({e["event_id"] for e in events}) == 5


async def test_a_batchs_tool_calls_and_transcripts_are_stored_as_given_and_checked_by_index(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    """The batch encodes a turn's tool calls and transcript once, for the check and the
    insert: what is read back is what was given (none, empty, some), a bad one is named."""
    calls = [ToolCall(id="c1", tool="reserve", args={"people": 2, "at": "20:00"})]
    transcript = [Message(role="tool", content="ok", tool_call_id="c1")]
    given = [
        turn("plain", "ann").model_copy(update={"tool_transcript": None}),
        turn("empty", "ann").model_copy(update={"tool_transcript": []}),
        turn("tools", "ann").model_copy(
            update={"tool_calls": calls, "tool_transcript": transcript}
        ),
    ]
    async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
        await memory.remember_many(given)
        assert await memory.remember_many(given) == ["plain", "empty", "tools"]  # the same
        nul = turn("nul", "ann").model_copy(
            update={"tool_calls": [ToolCall(tool="x", args={"v": "a\x00b"})]}
        )
        with pytest.raises(InvalidInputError, match=r"episodes\[1\]\.tool_calls.*NUL"):
            await memory.remember_many([turn("fine", "ann"), nul])
        stored = {e.id: e for e in (await memory.export(user_id="ann")).episodes}
    assert set(stored) == {"plain", "empty", "tools"}
    assert (stored["plain"].tool_calls, stored["plain"].tool_transcript) == ([], None)
    assert (stored["empty"].tool_calls, stored["empty"].tool_transcript) == ([], [])
    assert stored["tools"].tool_calls == calls and stored["tools"].tool_transcript == transcript


async def test_a_batch_with_a_bad_item_or_too_many_is_refused_whole(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
        bad = [turn(f"ok{k}", "ann") for k in range(5)]
        bad[3] = turn("nul", "ann", "a\x00b")
        with pytest.raises(InvalidInputError, match=r"^episodes\[3\]\.input: ") as refused:
            await memory.remember_many(bad)
        assert refused.value.field == "episodes[3].input"
        too_many = [turn(f"m{k}", "ann") for k in range(MAX_REMEMBER_BATCH + 1)]
        with pytest.raises(BatchTooLargeError, match=f"the most is {MAX_REMEMBER_BATCH}"):
            await memory.remember_many(too_many)
        with pytest.raises(InvalidInputError, match=r"^episodes: must be a list"):
            await memory.remember_many(turn("x", "ann"))  # type: ignore[arg-type]
        assert await memory.remember_many([]) == []
    assert await counts(engine) == (0, 0)
    assert await feed(redis, write_settings) == []


async def test_what_one_memory_remembered_another_finds_at_once(
    engine: AsyncEngine, redis: Redis, write_settings: Settings, database_url: str
) -> None:
    """Read-your-writes across instances with their own connections (two processes' worth)."""
    async with (
        Memory(PROJECT, settings=write_settings) as writer,
        Memory(PROJECT, settings=write_settings) as reader,
    ):
        for n in range(20):
            await writer.remember(turn(f"r{n}", "ann", f"pelican{n} sighted at the harbour"))
            found = await reader.recall(f"pelican{n}", user_id="ann", limit=1)
            assert [e.id for e in found] == [f"r{n}"]
        await writer.remember_many([turn(f"q{n}", "bob", f"osprey{n} nest") for n in range(5)])
        messages = await reader.session_messages("s-bob", user_id="bob", limit=100)
        assert [m.content for m in messages if m.role == "user"] == [
            f"osprey{n} nest" for n in range(5)
        ]


async def test_the_http_batch_door_stores_a_batch_and_refuses_a_bad_or_large_one(
    redis: Redis, settings: Settings, database_url: str, engine: AsyncEngine
) -> None:
    settings = settings.model_copy(update={"database_url": database_url})
    port = free_port()
    env = worker_env(settings, MEMWORKER_API_MAX_REQUEST_BYTES=str(4 << 20))
    process = Memworker(
        ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
    )
    try:
        process.wait_for(f"on http://127.0.0.1:{port}")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            good = {"session_id": "s1", "input": "hello", "output": "hi"}
            body = {"user_id": "ann", "turns": [{**good, "id": f"h{k}"} for k in range(3)]}
            done = await http.post("/v1/remember_many", json=body)
            assert done.status_code == 200, done.text
            assert done.json() == {"ids": ["h0", "h1", "h2"]}
            again = await http.post("/v1/remember_many", json=body)
            assert again.status_code == 200 and again.json() == done.json()

            bad = {"user_id": "ann", "turns": [good, {**good, "session_id": "a b"}]}
            refused = await http.post("/v1/remember_many", json=bad)
            assert refused.status_code == 422
            assert refused.json()["error"].startswith("invalid arguments: turns.1.session_id:")

            large = {"user_id": "ann", "turns": [good] * (MAX_REMEMBER_BATCH + 1)}
            too_many = await http.post("/v1/remember_many", json=large)
            assert too_many.status_code == 413
            assert f"the most is {MAX_REMEMBER_BATCH}" in too_many.json()["error"]

            other = {"user_id": "ann", "turns": [{**good, "id": "h1", "input": "changed"}]}
            conflict = await http.post("/v1/remember_many", json=other)
            assert conflict.status_code == 409, conflict.text
    finally:
        process.close()
    assert await counts(engine) == (3, 0)


async def test_concurrent_remembers_of_one_id_are_one_turn_or_one_conflict(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    """Calls inserted together in one round: the same id twice is one turn, other content
    for it fails that call alone, and the round's other turns are stored."""
    async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
        calls = [memory.remember(turn(f"n{k}", "ann")) for k in range(10)]
        calls += [memory.remember(turn("dup", "ann")), memory.remember(turn("dup", "ann"))]
        calls += [memory.remember(turn("dup", "ann", "other words"))]
        got = await asyncio.gather(*calls, return_exceptions=True)
    assert got[:12] == [f"n{k}" for k in range(10)] + ["dup", "dup"]
    assert isinstance(got[12], EpisodeConflictError), got[12]
    assert await counts(engine) == (11, 0)
    assert sorted(e["episode_id"] for e in await feed(redis, write_settings)) == sorted(
        [f"n{k}" for k in range(10)] + ["dup"]
    )


async def test_a_turn_postgres_refuses_fails_its_own_call_not_its_rounds(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    """Calls inserted in one round: when Postgres refuses one turn's data (a trigger here
    stands for whatever the input rule might miss), the others are stored all the same."""
    async with poison_refused(engine):
        async with Memory(PROJECT, settings=write_settings, engine=engine, redis=redis) as memory:
            calls = [memory.remember(turn(f"p{k}", "ann")) for k in range(9)]
            calls.insert(4, memory.remember(turn("bad", "ann", "poison")))
            got = await asyncio.gather(*calls, return_exceptions=True)
        assert [g for g in got if isinstance(g, str)] == [f"p{k}" for k in range(9)]
        [refused] = [g for g in got if isinstance(g, Exception)]
        assert "poison refused" in str(refused)
        assert await counts(engine) == (9, 0)
