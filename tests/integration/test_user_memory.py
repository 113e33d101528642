"""User memory (``worker.Memory``, LoomFlow 0.20's ``Memory``) against real Redis and Postgres:
partitions by user and project, pinned blocks, per-turn episodes, bi-temporal facts, session
episodes read as a user's, fact extraction exactly once, the change feed, and forget."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import worker
from tests.helpers import running_worker, worker_env
from tests.integration.results_factory import migrated_engine, publish, terminated
from tests.redis_process import RedisProcess
from worker.consolidation.consolidator import Consolidator
from worker.keys import changes_stream
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings
from worker.user_memory.extractors import LessonsExtractor
from worker.user_memory.facts import FactConflictError
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Fact, Message, ToolCall
from worker.user_memory.turns import EpisodeConflictError, SessionEpisode

PROJECT = "proj-um"
T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(database_url) as engine:
        yield engine


@pytest.fixture
def um_settings(redis_url: str, prefix: str, database_url: str) -> Settings:
    """Turns left to an indexer (none runs): recall by words, whether or not the server has
    pgvector (embedding at remember: ``tests/recall/test_remember_recallable.py``)."""
    return Settings(
        redis_url=redis_url,
        stream_prefix=prefix,
        database_url=database_url,
        remember_embedding="indexer",
    )


@pytest.fixture
async def memory(engine: AsyncEngine, redis: Redis, um_settings: Settings) -> AsyncIterator[Memory]:
    async with Memory(PROJECT, settings=um_settings, engine=engine, redis=redis) as memory:
        yield memory


def turn(
    turn_id: str,
    words: str,
    *,
    user_id: str | None,
    session_id: str = "s-1",
    at: datetime = T,
    output: str | None = None,
    **fields: Any,
) -> Episode:
    return Episode(
        id=turn_id,
        session_id=session_id,
        user_id=user_id,
        occurred_at=at,
        input=words,
        output=output if output is not None else f"noted: {words}",
        **fields,
    )


def fact(
    obj: str,
    *,
    user_id: str | None = "alice",
    subject: str = "alice",
    predicate: str = "lives_in",
    valid_from: datetime = T,
    **fields: Any,
) -> Fact:
    return Fact(
        user_id=user_id,
        subject=subject,
        predicate=predicate,
        object=obj,
        valid_from=valid_from,
        **fields,
    )


async def scalar(engine: AsyncEngine, sql: str, **params: Any) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text(sql), params)).scalar()


async def feed_entries(redis: Redis, settings: Settings, project: str = PROJECT) -> list[bytes]:
    """The raw ``data`` of every entry of the project's change feed, oldest first."""
    stream = changes_stream(settings.stream_prefix, project, settings.shards)
    entries: Any = await redis.xrange(stream)
    return [fields[b"data"] for _id, fields in entries]


async def feed(redis: Redis, settings: Settings, project: str = PROJECT) -> list[dict[str, Any]]:
    return [orjson.loads(data) for data in await feed_entries(redis, settings, project)]


async def owed_events(engine: AsyncEngine, project: str = PROJECT) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT payload FROM memory_changes WHERE project_id = :p ORDER BY seq"),
            {"p": project},
        )
        return [dict(r.payload) for r in rows]


def isolation_warnings(caught: Iterable[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, worker.IsolationWarning)]


# -- 1. partitions: user_id and project -------------------------------------------------------


async def test_user_id_is_a_hard_partition_of_blocks_episodes_and_facts(memory: Memory) -> None:
    users: list[str | None] = ["alice", "bob", None]
    for user in users:
        name = user or "anon"
        await memory.update_block("persona", f"{name} persona", user_id=user)
        # The same session id for everyone: the session is no way around the partition.
        await memory.remember(turn(f"t-{name}-1", f"kafka consumer for {name}", user_id=user))
        await memory.remember(
            turn(f"t-{name}-2", f"redis streams for {name}", user_id=user, at=T + timedelta(1))
        )
        # The same subject and predicate: one user's fact never supersedes another's.
        await memory.facts.append(fact(f"city of {name}", user_id=user, subject="user"))

    with warnings.catch_warnings(record=True):  # None's recall warns (tested on its own)
        for user in users:
            name = user or "anon"
            assert [b.content for b in await memory.working(user_id=user)] == [f"{name} persona"]

            found = await memory.recall("kafka consumer", user_id=user)
            # the match first; its session's next turn may follow as its context, never a
            # turn of another partition
            assert [e.id for e in found][:1] == [f"t-{name}-1"]
            assert {e.id for e in found} <= {f"t-{name}-1", f"t-{name}-2"}
            assert found[0].user_id == user
            scored = await memory.recall_scored("kafka redis", user_id=user, limit=10)
            assert {m.episode.id for m in scored} == {f"t-{name}-1", f"t-{name}-2"}
            assert all(m.episode.user_id == user for m in scored)
            # A query nothing matches still gives context, only the user's own.
            fallback = await memory.recall("zebra", user_id=user, limit=10)
            assert {e.id for e in fallback} == {f"t-{name}-1", f"t-{name}-2"}

            messages = await memory.session_messages("s-1", user_id=user)
            assert [m.content for m in messages] == [
                f"kafka consumer for {name}",
                f"noted: kafka consumer for {name}",
                f"redis streams for {name}",
                f"noted: redis streams for {name}",
            ]

            profile = await memory.profile(user_id=user)
            assert (profile.user_id, profile.episode_count, profile.fact_count) == (user, 2, 1)
            assert profile.recent_sessions == ["s-1"]
            assert profile.last_seen == T + timedelta(1)
            assert [f.object for f in profile.sample_facts] == [f"city of {name}"]

            export = await memory.export(user_id=user)
            assert [e.id for e in export.episodes] == [f"t-{name}-1", f"t-{name}-2"]
            assert [f.object for f in export.facts] == [f"city of {name}"]
            assert export.facts[0].valid_until is None  # not superseded by another user's
            assert [b.content for b in export.blocks] == [f"{name} persona"]

            facts = await memory.recall_facts("city", user_id=user)
            assert [f.object for f in facts] == [f"city of {name}"]

    # A user with nothing sees nothing, not someone else's fallback context.
    assert await memory.recall("kafka", user_id="carol") == []
    assert await memory.recall_facts("city", user_id="carol") == []
    assert await memory.working(user_id="carol") == []
    assert await memory.session_messages("s-1", user_id="carol") == []
    empty = await memory.profile(user_id="carol")
    assert (empty.episode_count, empty.fact_count, empty.last_seen) == (0, 0, None)


async def test_recall_without_user_id_warns_only_where_named_users_exist(
    engine: AsyncEngine, redis: Redis, um_settings: Settings
) -> None:
    anon_only = Memory("proj-anon", settings=um_settings, engine=engine, redis=redis)
    named = Memory("proj-named", settings=um_settings, engine=engine, redis=redis)
    await anon_only.remember(turn("a-1", "weekly report", user_id=None))
    await anon_only.facts.append(fact("Paris", user_id=None))
    await named.remember(turn("n-1", "weekly report", user_id=None))
    await named.remember(turn("n-2", "weekly report", user_id="alice"))
    await named.facts.append(fact("Lyon", user_id=None))
    await named.facts.append(fact("Rome", user_id="alice"))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Another project's named users are no reason to warn here.
        assert [e.id for e in await anon_only.recall("report")] == ["a-1"]
        assert [f.object for f in await anon_only.recall_facts("lives")] == ["Paris"]
    assert isolation_warnings(caught) == []

    with pytest.warns(worker.IsolationWarning, match="user_id") as recall_warned:
        found = await named.recall("report")
    assert [e.id for e in found] == ["n-1"]  # the anonymous bucket only
    assert recall_warned[0].filename == __file__  # points at the caller's line
    with pytest.warns(worker.IsolationWarning, match="user_id"):
        scored = await named.recall_scored("report")
    assert [m.episode.id for m in scored] == ["n-1"]
    with pytest.warns(worker.IsolationWarning, match="user_id") as facts_warned:
        facts = await named.recall_facts("lives")
    assert [f.object for f in facts] == ["Lyon"]
    assert facts_warned[0].filename == __file__

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [e.id for e in await named.recall("report", user_id="alice")] == ["n-2"]
        assert [f.object for f in await named.recall_facts("lives", user_id="alice")] == ["Rome"]
    assert isolation_warnings(caught) == []


async def test_the_isolation_warning_is_loomflows_too(memory: Memory) -> None:
    import loomflow.core.context as core_context  # a dev dependency: never skipped

    await memory.remember(turn("t-1", "hello", user_id="alice"))
    with pytest.warns(core_context.IsolationWarning):
        await memory.recall("hello")


async def test_two_projects_never_see_each_other(
    engine: AsyncEngine, redis: Redis, um_settings: Settings
) -> None:
    one = Memory("proj-one", settings=um_settings, engine=engine, redis=redis)
    two = Memory("proj-two", settings=um_settings, engine=engine, redis=redis)
    for memory, tag in ((one, "one"), (two, "two")):
        await memory.update_block("persona", f"persona in {tag}", user_id="alice")
        # The same turn id in both projects is two turns, no conflict.
        await memory.remember(turn("t-1", f"invoice question in {tag}", user_id="alice"))
        await memory.facts.append(fact(f"city in {tag}"))
    for memory, tag in ((one, "one"), (two, "two")):
        assert [b.content for b in await memory.working(user_id="alice")] == [f"persona in {tag}"]
        assert [e.input for e in await memory.recall("invoice", user_id="alice")] == [
            f"invoice question in {tag}"
        ]
        assert [f.object for f in await memory.recall_facts("city", user_id="alice")] == [
            f"city in {tag}"
        ]
        profile = await memory.profile(user_id="alice")
        assert (profile.episode_count, profile.fact_count) == (1, 1)
        export = await memory.export(user_id="alice")
        assert (len(export.episodes), len(export.facts), len(export.blocks)) == (1, 1, 1)
    two_before = (await two.export(user_id="alice")).model_dump(exclude={"exported_at"})

    assert await one.forget(user_id="alice") == 3

    assert (await two.export(user_id="alice")).model_dump(exclude={"exported_at"}) == two_before
    assert (await one.export(user_id="alice")).model_dump(exclude={"exported_at", "user_id"}) == {
        "episodes": [],
        "facts": [],
        "blocks": [],
    }
    assert await scalar(engine, "SELECT count(*) FROM episodes WHERE project_id = 'proj-two'") == 1


# -- 2. blocks --------------------------------------------------------------------------------


async def test_blocks_keep_their_pin_slot_and_new_ones_take_the_next(memory: Memory) -> None:
    await memory.update_block("persona", "a helpful assistant", user_id="alice")
    await memory.update_block("human", "Alice, a data engineer", user_id="alice")
    await memory.append_block("notes", "likes tea.", user_id="alice")
    await memory.update_block("persona", "a terse assistant", user_id="alice")
    await memory.append_block("notes", " hates meetings.", user_id="alice")
    await memory.update_block("goals", "ship v2", user_id="alice")

    blocks = await memory.working(user_id="alice")
    assert [(b.name, b.pinned_order, b.content) for b in blocks] == [
        ("persona", 0, "a terse assistant"),
        ("human", 1, "Alice, a data engineer"),
        ("notes", 2, "likes tea. hates meetings."),
        ("goals", 3, "ship v2"),
    ]
    assert blocks[0].updated_at > blocks[1].updated_at  # the update moved its time, not its slot
    # Another user's slots start at 0 of their own.
    await memory.update_block("goals", "learn Rust", user_id="bob")
    assert [(b.name, b.pinned_order) for b in await memory.working(user_id="bob")] == [("goals", 0)]


async def test_concurrent_appends_from_tasks_lose_nothing(memory: Memory) -> None:
    await asyncio.gather(
        *(memory.append_block("log", f"[{i}]", user_id="alice") for i in range(200)),
        # new blocks created at the same time never share a slot
        *(memory.update_block(f"b{i}", "x", user_id="alice") for i in range(20)),
    )
    blocks = {b.name: b for b in await memory.working(user_id="alice")}
    content = blocks["log"].content
    assert sorted(content[1:-1].split("][")) == sorted(str(i) for i in range(200))
    assert len(content) == sum(len(f"[{i}]") for i in range(200))
    assert sorted(b.pinned_order for b in blocks.values()) == list(range(21))


APPENDER = """
import asyncio, sys
from pathlib import Path
from worker.user_memory.memory import Memory

async def main() -> None:
    tag, count, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    async with Memory("proj-um") as memory:
        await memory.working(user_id="alice")
        print("ready", flush=True)
        while not go.exists():
            await asyncio.sleep(0.005)
        await asyncio.gather(
            *(memory.append_block("log", f"[{tag}-{i}]", user_id="alice") for i in range(count))
        )

asyncio.run(main())
"""

READ_THEN_WRITE = """
import asyncio, json
from worker.user_memory.memory import Memory

async def main() -> None:
    async with Memory("proj-um") as memory:
        seen = [(b.name, b.content) for b in await memory.working(user_id="alice")]
        await memory.update_block("from-child", "written by another process", user_id="alice")
        print(json.dumps(seen), flush=True)

asyncio.run(main())
"""


def python_process(settings: Settings, script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=worker_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_concurrent_appends_from_three_processes_and_tasks_lose_nothing(
    memory: Memory, um_settings: Settings, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    procs = [python_process(um_settings, APPENDER, f"p{n}", "50", str(go)) for n in range(3)]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else ""
        go.touch()
        await asyncio.gather(
            *(memory.append_block("log", f"[main-{i}]", user_id="alice") for i in range(50))
        )
        for proc in procs:
            _out, err = await asyncio.to_thread(proc.communicate, timeout=60)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    [block] = await memory.working(user_id="alice")
    items = block.content[1:-1].split("][")
    expected = [f"{tag}-{i}" for tag in ("p0", "p1", "p2", "main") for i in range(50)]
    assert len(items) == 200
    assert sorted(items) == sorted(expected)


async def test_another_process_reads_a_write_at_once_and_this_one_reads_its(
    memory: Memory, um_settings: Settings
) -> None:
    await memory.update_block("persona", "likes green tea", user_id="alice")
    proc = python_process(um_settings, READ_THEN_WRITE)
    out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out) == [["persona", "likes green tea"]]
    assert [(b.name, b.content) for b in await memory.working(user_id="alice")] == [
        ("persona", "likes green tea"),
        ("from-child", "written by another process"),
    ]


async def test_blocks_survive_a_restart_of_a_redis_without_persistence(
    engine: AsyncEngine, database_url: str, prefix: str, tmp_path: Path
) -> None:
    server = RedisProcess(tmp_path, persistent=False)  # --save "" --appendonly no
    server.start()
    try:
        settings = Settings(
            redis_url=server.url,
            stream_prefix=prefix,
            database_url=database_url,
            redis_retry_seconds=2,
        )
        async with Memory(PROJECT, settings=settings, engine=engine) as memory:
            await memory.update_block("persona", "a patient tutor", user_id="alice")
            await memory.append_block("notes", "prefers examples", user_id="alice")
            assert len(await feed_entries(memory.redis, settings)) == 2  # type: ignore[arg-type]

            server.stop()
            server.start()
            assert await memory.redis.dbsize() == 0  # Redis came back empty

            assert [(b.name, b.content) for b in await memory.working(user_id="alice")] == [
                ("persona", "a patient tutor"),
                ("notes", "prefers examples"),
            ]
            # ... and writes go on after the restart
            await memory.append_block("notes", ", short ones", user_id="alice")
        async with Memory(PROJECT, settings=settings) as fresh:
            assert [b.content for b in await fresh.working(user_id="alice")] == [
                "a patient tutor",
                "prefers examples, short ones",
            ]
    finally:
        server.stop()


async def test_a_block_past_max_value_bytes_is_refused_and_nothing_changes(
    engine: AsyncEngine, redis: Redis, redis_url: str, prefix: str, database_url: str
) -> None:
    settings = Settings(
        redis_url=redis_url, stream_prefix=prefix, database_url=database_url, max_value_bytes=64
    )
    memory = Memory(PROJECT, settings=settings, engine=engine, redis=redis)
    await memory.update_block("persona", "p" * 60, user_id="alice")
    await memory.update_block("notes", "n" * 64, user_id="alice")  # exactly the limit
    before = await memory.working(user_id="alice")
    events_before = await feed(redis, settings)

    with pytest.raises(ValueError, match="MEMWORKER_MAX_VALUE_BYTES"):
        await memory.update_block("persona", "q" * 65, user_id="alice")
    with pytest.raises(ValueError, match="MEMWORKER_MAX_VALUE_BYTES"):
        await memory.update_block("persona", "é" * 33, user_id="alice")  # 33 chars, 66 bytes
    with pytest.raises(ValueError, match="MEMWORKER_MAX_VALUE_BYTES"):
        await memory.append_block("persona", "12345", user_id="alice")  # 60 + 5 > 64
    with pytest.raises(ValueError, match="MEMWORKER_MAX_VALUE_BYTES"):
        await memory.update_block("huge", "h" * 65, user_id="alice")  # a new block too

    assert await memory.working(user_id="alice") == before
    assert await feed(redis, settings) == events_before
    assert await owed_events(engine) == []
    await memory.append_block("persona", "1234", user_id="alice")  # 64: still fits
    assert (await memory.working(user_id="alice"))[0].content == "p" * 60 + "1234"


# -- 3. remember ------------------------------------------------------------------------------


async def test_remember_is_idempotent_and_refuses_other_content_under_the_same_id(
    memory: Memory, engine: AsyncEngine, redis: Redis, um_settings: Settings
) -> None:
    first = turn("turn-1", "what is my invoice total", user_id="alice", output="42 EUR")
    assert await memory.remember(first) == "turn-1"
    again = first.model_copy(update={"occurred_at": T + timedelta(hours=5)})  # a retry, later
    assert await memory.remember(again) == "turn-1"
    # Concurrent retries of the same turn: still one.
    assert set(await asyncio.gather(*(memory.remember(first) for _ in range(10)))) == {"turn-1"}

    count = "SELECT count(*) FROM episodes WHERE project_id = :p AND turn_id = 'turn-1'"
    assert await scalar(engine, count, p=PROJECT) == 1
    [stored] = (await memory.export(user_id="alice")).episodes
    assert stored == first  # the first call's occurred_at stays
    await memory.flush_changes()  # remember returns before its event is published
    assert [e["type"] for e in await feed(redis, um_settings)] == ["episode.remembered"]

    other = first.model_copy(update={"output": "43 EUR"})
    with pytest.raises(EpisodeConflictError):
        await memory.remember(other)
    assert (await memory.export(user_id="alice")).episodes == [first]
    assert await scalar(engine, count, p=PROJECT) == 1
    # another user's turn-1 is theirs (test_user_memory_turn_ids.py)


async def test_a_turn_is_findable_by_its_words_as_soon_as_remember_returns(memory: Memory) -> None:
    await memory.remember(turn("t-1", "The espresso machine is broken", user_id="alice"))
    [match] = await memory.recall_scored("espresso", user_id="alice")
    assert match.episode.id == "t-1"
    assert match.bm25_score is not None and match.bm25_score > 0
    assert match.score > 0
    # English stemming ("machines" finds "machine"), and the output's words count too.
    assert [e.id for e in await memory.recall("machines", user_id="alice")] == ["t-1"]
    assert [e.id for e in await memory.recall("noted espresso", user_id="alice")] == ["t-1"]


async def test_time_range_bounds_occurred_at(memory: Memory) -> None:
    days = [T + timedelta(days=d) for d in range(4)]
    for d, at in enumerate(days):
        await memory.remember(turn(f"t-{d}", f"budget review {d}", user_id="alice", at=at))

    async def ids(query: str, lo: datetime, hi: datetime) -> list[str]:
        found = await memory.recall(query, user_id="alice", limit=10, time_range=(lo, hi))
        return sorted(e.id for e in found)

    assert await ids("budget", days[1], days[2]) == ["t-1", "t-2"]  # both ends included
    assert await ids("budget", days[1] + timedelta(seconds=1), days[3]) == ["t-2", "t-3"]
    assert await ids("budget", days[3] + timedelta(seconds=1), days[3] + timedelta(1)) == []
    # Naive datetimes are UTC, as LoomFlow reads them.
    naive = (days[0].replace(tzinfo=None), days[0].replace(tzinfo=None))
    assert await ids("budget", *naive) == ["t-0"]
    # The fallback of a query nothing matches keeps to the range too.
    assert await ids("zebra", days[2] - timedelta(minutes=1), days[2]) == ["t-2"]


async def test_loomflows_own_episode_is_remembered_and_read_back(memory: Memory) -> None:
    import loomflow.core.types as types  # a dev dependency: never skipped

    theirs = types.Episode(
        session_id="s-lf",
        user_id="alice",
        occurred_at=T,
        input="book a table for two",
        output="booked at 8pm",
        tool_calls=[types.ToolCall(tool="reserve", args={"people": 2})],
        tool_transcript=[types.Message(role=types.Role.TOOL, content="ok", tool_call_id="c1")],
    )
    assert await memory.remember(theirs) == theirs.id
    assert await memory.remember(theirs) == theirs.id  # idempotent for theirs too
    [found] = await memory.recall("table", user_id="alice")
    assert found == theirs
    assert found.id == theirs.id and found.input == theirs.input
    assert [(c.tool, c.args) for c in found.tool_calls] == [("reserve", {"people": 2})]
    messages = await memory.session_messages("s-lf", user_id="alice")
    assert [(m.role, m.content) for m in messages] == [
        ("user", "book a table for two"),
        ("tool", "ok"),
        ("assistant", "booked at 8pm"),
    ]


async def test_session_messages_are_the_last_turns_oldest_first(memory: Memory) -> None:
    for i in range(6):
        transcript = [Message(role="tool", content=f"tool {i}")] if i == 5 else None
        calls = [ToolCall(tool="lookup")] if i == 5 else []
        await memory.remember(
            turn(
                f"t-{i}",
                f"q{i}",
                user_id="alice",
                output=f"a{i}",
                at=T + timedelta(minutes=i),
                tool_transcript=transcript,
                tool_calls=calls,
            )
        )
    await memory.remember(turn("other", "elsewhere", user_id="alice", session_id="s-2"))
    messages = await memory.session_messages("s-1", user_id="alice", limit=4)
    assert [(m.role, m.content) for m in messages] == [
        ("user", "q4"),
        ("assistant", "a4"),
        ("user", "q5"),
        ("tool", "tool 5"),
        ("assistant", "a5"),
    ]


# -- 4. facts ---------------------------------------------------------------------------------


async def test_a_contradicting_fact_supersedes_and_a_backfilled_one_is_closed(
    memory: Memory,
) -> None:
    t1, t2, t0 = T, T + timedelta(days=30), T - timedelta(days=30)
    paris = await memory.facts.append(fact("Paris", valid_from=t1))
    rome = await memory.facts.append(fact("Rome", valid_from=t2))
    berlin = await memory.facts.append(fact("Berlin", valid_from=t0))  # learned late, older

    stored = {f.id: f for f in await memory.facts.query(user_id="alice", limit=100)}
    assert stored[paris].valid_until == t2  # closed where Rome begins
    assert stored[rome].valid_until is None
    assert stored[berlin].valid_until == t1  # closed where the newer Paris begins
    assert len(stored) == 3  # history stays

    async def lives_at(when: datetime | None) -> list[str]:
        return [
            f.object for f in await memory.recall_facts("lives", valid_at=when, user_id="alice")
        ]

    assert await lives_at(t0 + timedelta(days=1)) == ["Berlin"]
    assert await lives_at(t1) == ["Paris"]
    assert await lives_at(t2 - timedelta(seconds=1)) == ["Paris"]
    assert await lives_at(t2) == ["Rome"]
    assert await lives_at(t0 - timedelta(days=1)) == []
    assert sorted(await lives_at(None)) == ["Berlin", "Paris", "Rome"]
    now = await memory.facts.query(user_id="alice", predicate="lives_in", valid_at=t2)
    assert [f.object for f in now] == ["Rome"]


async def test_the_same_claim_twice_is_one_fact_with_both_sources(
    memory: Memory, engine: AsyncEngine
) -> None:
    first = await memory.facts.append(fact("Paris", sources=["ep-1"]))
    again = await memory.facts.append(
        fact("Paris", valid_from=T + timedelta(days=3), sources=["ep-2", "ep-1"])
    )
    assert again == first
    assert await memory.facts.count(user_id="alice") == 1
    [stored] = await memory.facts.query(user_id="alice")
    assert sorted(stored.sources) == ["ep-1", "ep-2"]
    assert stored.valid_from == T and stored.valid_until is None
    assert await scalar(engine, "SELECT count(*) FROM facts") == 1


async def test_predicates_are_canonical(memory: Memory) -> None:
    ids = {
        await memory.facts.append(fact("Alice Smith", predicate=p))
        for p in ("nameIs", "Name_Is", "name-is", "name is")
    }
    assert len(ids) == 1
    [stored] = await memory.facts.query(user_id="alice", predicate="NameIs")
    assert (stored.predicate, stored.object) == ("name_is", "Alice Smith")
    # A contradiction spelled differently still supersedes.
    await memory.facts.append(fact("Alice Jones", predicate="name-is", valid_from=T + timedelta(1)))
    [current] = await memory.facts.query(
        user_id="alice", predicate="nameIs", valid_at=T + timedelta(2)
    )
    assert current.object == "Alice Jones"


async def test_concurrent_contradicting_facts_leave_one_answer_at_any_time(
    memory: Memory,
) -> None:
    starts = [T + timedelta(days=d) for d in range(25)]
    order = list(range(25))
    random.Random(7).shuffle(order)
    await asyncio.gather(
        *(memory.facts.append(fact(f"city-{d}", valid_from=starts[d])) for d in order)
    )
    facts = sorted(await memory.facts.query(user_id="alice", limit=100), key=lambda f: f.valid_from)
    assert [f.object for f in facts] == [f"city-{d}" for d in range(25)]
    # Each is closed exactly where the next begins: one answer at any time, no gap.
    assert [f.valid_until for f in facts] == [*starts[1:], None]


async def test_facts_delete_and_count_per_user(memory: Memory) -> None:
    await memory.facts.append(fact("Paris"))
    await memory.facts.append(fact("tea", predicate="likes"))
    await memory.facts.append(fact("Rome", user_id="bob", subject="bob"))
    await memory.facts.append(fact("Oslo", user_id=None, subject="someone"))
    counts = [await memory.facts.count(user_id=u) for u in ("alice", "bob", None)]
    assert counts == [2, 1, 1]

    assert await memory.facts.delete(user_id="alice") == 2

    assert [await memory.facts.count(user_id=u) for u in ("alice", "bob", None)] == [0, 1, 1]
    assert await memory.recall_facts("Paris", user_id="alice") == []
    assert [f.object for f in await memory.recall_facts("Rome", user_id="bob")] == ["Rome"]


# -- 5 and 6. session episodes belong to users; consolidate() ---------------------------------


async def test_a_finished_session_of_a_user_is_part_of_their_memory(
    memory: Memory, redis: Redis, um_settings: Settings, engine: AsyncEngine
) -> None:
    task = "Migrate the Kafka consumer to Redis Streams"
    lessons = ["check consumer group offsets first", "keep batches under 500"]
    async with running_worker(um_settings):
        client = LifecycleClient(redis, um_settings)
        for session_id, user in (("s-alice", "alice"), ("s-bob", "bob")):
            spawned = await client.spawn(
                PROJECT, session_id, "agent-1", user_id=user, agent_type_id="migrator"
            )
            assert (await client.wait(spawned, timeout=20)).type == "agent.spawned"
            ended = await client.terminate(
                PROJECT,
                session_id,
                "agent-1",
                agent_type_id="migrator",  # the episode's agent type is the terminate's
                task_description=f"{task} ({user})",
                lessons_learned=lessons if user == "alice" else ["bob's own lesson"],
                outcome="success",
            )
            assert (await client.wait(ended, timeout=20)).type == "agent.terminated"
    await Consolidator(um_settings, redis, engine).run_once()

    [found] = await memory.recall("kafka consumer", user_id="alice")
    assert isinstance(found, SessionEpisode)
    assert (found.session_id, found.user_id) == ("s-alice", "alice")
    assert found.input == f"{task} (alice)"
    assert found.output == "success: check consumer group offsets first; keep batches under 500"
    assert (found.agent_type_id, found.outcome, found.lessons_learned) == (
        "migrator",
        "success",
        lessons,
    )
    assert [e.session_id for e in await memory.recall("kafka", user_id="bob")] == ["s-bob"]
    profile = await memory.profile(user_id="alice")
    assert (profile.episode_count, profile.recent_sessions) == (1, ["s-alice"])
    # A turn of the same session sits beside the session's episode.
    later = found.occurred_at + timedelta(seconds=1)
    await memory.remember(
        turn("t-1", "and the DLQ?", user_id="alice", session_id="s-alice", at=later)
    )
    assert (await memory.profile(user_id="alice")).episode_count == 2
    messages = await memory.session_messages("s-alice", user_id="alice")
    assert [m.content for m in messages][-2:] == ["and the DLQ?", "noted: and the DLQ?"]

    extracting = Memory(
        PROJECT, settings=um_settings, engine=engine, redis=redis, consolidator=LessonsExtractor()
    )
    await extracting.consolidate()
    facts = await memory.facts.query(user_id="alice", subject="agent_type:migrator")
    assert sorted(f.object for f in facts) == sorted(lessons)
    assert all(f.confidence == pytest.approx(0.9) for f in facts)
    assert all(f.sources == [found.id] and f.valid_from == found.occurred_at for f in facts)
    [bobs] = await memory.facts.query(user_id="bob")
    assert (bobs.subject, bobs.object) == ("agent_type:migrator", "bob's own lesson")
    assert [f.object for f in await memory.recall_facts("offsets", user_id="alice")] == [lessons[0]]


def finished_sessions(user: str, count: int, start: int = 0) -> list[dict[str, Any]]:
    """Terminated results of ``count`` sessions of ``user``; every session learns the shared
    lesson and one of its own."""
    return [
        terminated(
            PROJECT,
            f"s-{user}-{i}",
            i,
            user_id=user,
            task_description=f"task {i}",
            lessons=["always pin versions", f"lesson number {i}"],
        )
        for i in range(start, start + count)
    ]


class CountingExtractor:
    """``LessonsExtractor`` that records which episodes it was given, holding each batch a
    moment so a concurrent run overlaps it."""

    def __init__(self, seen: list[str], *, fail: bool = False) -> None:
        self.seen = seen
        self.fail = fail

    async def consolidate(self, episodes: Iterable[Episode], *, store: Any) -> list[Any]:
        batch = list(episodes)
        self.seen.extend(e.id for e in batch)
        await asyncio.sleep(0.2)
        facts = await LessonsExtractor().consolidate(batch, store=store)
        if self.fail:
            raise RuntimeError("the model went away")
        return facts


async def unconsolidated(engine: AsyncEngine) -> int:
    return int(await scalar(engine, "SELECT count(*) FROM episodes WHERE consolidated_at IS NULL"))


async def test_consolidate_extracts_each_episode_exactly_once(
    memory: Memory, redis: Redis, um_settings: Settings, engine: AsyncEngine
) -> None:
    await publish(redis, um_settings, finished_sessions("alice", 6) + finished_sessions("bob", 2))
    await Consolidator(um_settings, redis, engine).run_once()
    await memory.remember(turn("t-1", "a turn has no lessons", user_id="alice"))
    seen: list[str] = []

    def extracting() -> Memory:
        return Memory(
            PROJECT,
            settings=um_settings,
            engine=engine,
            redis=redis,
            consolidator=CountingExtractor(seen),
        )

    await asyncio.gather(extracting().consolidate(), extracting().consolidate())
    await extracting().consolidate()
    await extracting().consolidate()

    assert len(seen) == 9 and len(set(seen)) == 9  # 8 sessions and the turn, once each
    assert await unconsolidated(engine) == 0
    alice = await memory.facts.query(user_id="alice", limit=100)
    assert sorted(f.object for f in alice) == sorted(
        ["always pin versions"] + [f"lesson number {i}" for i in range(6)]
    )
    [shared] = [f for f in alice if f.object == "always pin versions"]
    assert len(shared.sources) == 6  # learned six times: one fact from six episodes
    assert await memory.facts.count(user_id="bob") == 3

    # A session that finishes later is extracted by the next run, and only it.
    await publish(redis, um_settings, finished_sessions("alice", 1, start=6))
    await Consolidator(um_settings, redis, engine).run_once()
    await extracting().consolidate()
    assert len(seen) == 10
    assert await memory.facts.count(user_id="alice") == 8
    [shared] = await memory.facts.query(user_id="alice", object_="always pin versions")
    assert len(shared.sources) == 7


async def test_an_extractor_that_raises_leaves_episodes_to_be_retried(
    memory: Memory, redis: Redis, um_settings: Settings, engine: AsyncEngine
) -> None:
    await publish(redis, um_settings, finished_sessions("alice", 3))
    await Consolidator(um_settings, redis, engine).run_once()
    seen: list[str] = []
    failing = Memory(
        PROJECT,
        settings=um_settings,
        engine=engine,
        redis=redis,
        consolidator=CountingExtractor(seen, fail=True),
    )
    with pytest.raises(RuntimeError, match="the model went away"):
        await failing.consolidate()
    assert await unconsolidated(engine) == 3
    facts_after_failure = await memory.facts.count(user_id="alice")

    working = Memory(
        PROJECT,
        settings=um_settings,
        engine=engine,
        redis=redis,
        consolidator=CountingExtractor(seen),
    )
    await working.consolidate()
    assert await unconsolidated(engine) == 0
    assert len(seen) == 6  # taken again after the failure
    # What the failed run appended is not doubled by the retry.
    assert facts_after_failure == 4
    assert await memory.facts.count(user_id="alice") == 4


async def test_consolidate_without_an_extractor_does_nothing(
    memory: Memory, engine: AsyncEngine
) -> None:
    await memory.remember(turn("t-1", "hello", user_id="alice"))
    await memory.consolidate()
    assert await unconsolidated(engine) == 1


# -- 7. the change feed -----------------------------------------------------------------------


async def test_every_change_is_on_the_feed_in_order_without_content(
    memory: Memory, redis: Redis, um_settings: Settings, engine: AsyncEngine
) -> None:
    secrets = [
        "my bank PIN is 9931",
        "I am allergic to peanuts",
        "Springfield",
        "Shelbyville",
        "transferred the money",
    ]
    await memory.update_block("persona", secrets[0], user_id="alice")
    await memory.remember(turn("t-1", secrets[1], user_id="alice", output=secrets[4]))
    old = await memory.facts.append(fact(secrets[2]))
    new = await memory.facts.append(fact(secrets[3], valid_from=T + timedelta(days=1)))

    events = await feed(redis, um_settings)
    assert [e["type"] for e in events] == [
        "block.updated",
        "episode.remembered",
        "fact.added",
        "fact.added",
        "fact.superseded",
    ]
    assert all(e["project_id"] == PROJECT and e["user_id"] == "alice" for e in events)
    assert len({e["event_id"] for e in events}) == len(events)
    block, remembered, added_old, added_new, superseded = events
    assert block["name"] == "persona" and block["pinned_order"] == 0
    assert remembered["episode_id"] == "t-1" and remembered["session_id"] == "s-1"
    assert (added_old["fact_id"], added_new["fact_id"]) == (old, new)
    assert (superseded["fact_id"], superseded["superseded_by"]) == (old, new)
    raw = b"\n".join(await feed_entries(redis, um_settings))
    for secret in secrets:
        for word in secret.split():
            if len(word) > 4:
                assert word.encode() not in raw, word

    # forget deletes the user's entries from the feed too (#23), then says what went
    assert await memory.forget(user_id="alice") == 4
    [forgotten] = await feed(redis, um_settings)
    assert forgotten["type"] == "memory.forgotten" and forgotten["user_id"] == "alice"
    assert forgotten["counts"] == {"episodes": 1, "facts": 2, "blocks": 1}
    assert await owed_events(engine) == []  # all published, the outbox is empty


async def test_a_write_while_redis_is_down_succeeds_and_its_event_is_published_later(
    engine: AsyncEngine, database_url: str, prefix: str, tmp_path: Path
) -> None:
    server = RedisProcess(tmp_path, persistent=False)
    server.start()
    server.stop()  # a port nothing answers on
    settings = Settings(
        redis_url=server.url,
        stream_prefix=prefix,
        database_url=database_url,
        redis_retry_seconds=0.2,
        remember_embedding="indexer",  # the feed's events as without pgvector
    )
    try:
        memory = Memory(PROJECT, settings=settings, engine=engine)
        await memory.update_block("persona", "offline persona", user_id="alice")
        assert await memory.remember(turn("t-1", "offline question", user_id="alice")) == "t-1"
        await memory.facts.append(fact("Paris"))
        await memory.facts.append(fact("Rome", valid_from=T + timedelta(1)))

        # Everything is stored and readable without Redis.
        assert [b.content for b in await memory.working(user_id="alice")] == ["offline persona"]
        assert [e.id for e in await memory.recall("offline", user_id="alice")] == ["t-1"]
        facts = await memory.recall_facts("lives", user_id="alice")
        assert sorted(f.object for f in facts) == ["Paris", "Rome"]
        owed = [e["type"] for e in await owed_events(engine)]
        assert owed == [
            "block.updated",
            "episode.remembered",
            "fact.added",
            "fact.added",
            "fact.superseded",
        ]
        with pytest.raises(Exception):  # noqa: B017,PT011 - no Redis to publish to
            await memory.redis.ping()  # type: ignore[misc]

        server.start()
        assert await memory.flush_changes() == 5
        assert [e["type"] for e in await feed(memory.redis, settings)] == owed  # type: ignore[arg-type]
        assert await owed_events(engine) == []
        assert await memory.flush_changes() == 0  # published once
        await memory.close()
    finally:
        server.stop()


# -- 8. forget --------------------------------------------------------------------------------


async def test_forget_a_user_or_one_of_their_sessions(memory: Memory, engine: AsyncEngine) -> None:
    for user in ("alice", "bob"):
        for session in ("s-1", "s-2"):
            for i in range(2):
                await memory.remember(
                    turn(
                        f"{user}-{session}-{i}",
                        f"chat {i}",
                        user_id=user,
                        session_id=session,
                        at=T + timedelta(minutes=i),
                    )
                )
        await memory.facts.append(fact("Paris", user_id=user, subject=user))
        await memory.facts.append(fact("tea", user_id=user, subject=user, predicate="likes"))
        await memory.update_block("persona", f"{user}'s persona", user_id=user)
    await memory.remember(turn("anon-1", "chat", user_id=None, session_id="s-1"))
    bob_before = (await memory.export(user_id="bob")).model_dump(exclude={"exported_at"})

    assert await memory.forget(user_id="alice", session_id="s-1") == 2
    alice = await memory.export(user_id="alice")
    assert [e.id for e in alice.episodes] == ["alice-s-2-0", "alice-s-2-1"]
    assert len(alice.facts) == 2 and len(alice.blocks) == 1  # a session's forget keeps those
    assert await memory.session_messages("s-1", user_id="alice") == []

    assert await memory.forget(user_id="alice") == 2 + 2 + 1
    gone = await memory.export(user_id="alice")
    assert (gone.episodes, gone.facts, gone.blocks) == ([], [], [])
    profile = await memory.profile(user_id="alice")
    assert (profile.episode_count, profile.fact_count, profile.recent_sessions) == (0, 0, [])
    assert await memory.recall("chat", user_id="alice") == []

    assert (await memory.export(user_id="bob")).model_dump(exclude={"exported_at"}) == bob_before
    with warnings.catch_warnings(record=True):
        assert [e.id for e in await memory.recall("chat", user_id=None)] == ["anon-1"]
    assert await memory.forget(user_id="alice") == 0  # nothing left to forget


# -- what the first tests found (each was a bug) -----------------------------------------------


async def test_reappending_a_fact_id_with_a_new_object_is_refused_never_silently_ignored(
    memory: Memory,
) -> None:
    likes = fact("tea", predicate="likes")
    await memory.facts.append(likes)
    changed = likes.model_copy(update={"object": "coffee", "valid_from": T + timedelta(days=1)})
    with pytest.raises(FactConflictError, match="already stored with other content"):
        await memory.facts.append(changed)
    now = await memory.facts.query(user_id="alice", predicate="likes", valid_at=T + timedelta(2))
    assert [f.object for f in now] == ["tea"]  # unchanged: a changed belief is a new fact


async def test_a_fact_whose_id_is_taken_never_closes_another_fact(
    memory: Memory, redis: Redis, um_settings: Settings
) -> None:
    city = await memory.facts.append(fact("Paris"))
    await memory.facts.append(fact("tea", predicate="likes"))
    # A fact under an id already used by another claim (a copied or reused Fact)
    reused = Fact(
        id=city,
        user_id="alice",
        subject="alice",
        predicate="likes",
        object="coffee",
        valid_from=T + timedelta(days=1),
    )
    with contextlib.suppress(ValueError):  # refusing it is a fix too
        await memory.facts.append(reused)
    later = await memory.facts.query(user_id="alice", predicate="likes", valid_at=T + timedelta(2))
    # Today: [] — "tea" was closed at T+1 day and "coffee" was never stored; the feed says
    # fact.added for a fact that does not exist.
    assert len(later) == 1
    types = [e["type"] for e in await feed(redis, um_settings)]
    assert types.count("fact.added") == 2 + (later[0].object == "coffee")


async def test_a_lesson_learned_again_is_one_fact_whatever_order_sessions_are_extracted(
    memory: Memory, redis: Redis, um_settings: Settings, engine: AsyncEngine
) -> None:
    extracting = Memory(
        PROJECT, settings=um_settings, engine=engine, redis=redis, consolidator=LessonsExtractor()
    )
    # The later session is consolidated and extracted first; the earlier one's episode comes
    # in after (a consolidator that lagged, a replay, remember with a past occurred_at).
    await publish(redis, um_settings, finished_sessions("alice", 1, start=100))
    await Consolidator(um_settings, redis, engine).run_once()
    await extracting.consolidate()
    await publish(redis, um_settings, finished_sessions("alice", 1, start=0))
    await Consolidator(um_settings, redis, engine).run_once()
    await extracting.consolidate()

    shared = await memory.facts.query(user_id="alice", object_="always pin versions")
    assert len(shared) == 1  # today: 2, both valid from T0 + 100 s on


async def test_an_empty_user_id_is_not_the_anonymous_bucket(memory: Memory) -> None:
    await memory.update_block("persona", "anonymous visitor", user_id=None)
    with contextlib.suppress(ValueError):  # refusing '' is a fix too
        await memory.update_block("persona", "a user named ''", user_id="")
    with contextlib.suppress(ValueError):
        await memory.forget(user_id="")
    assert [b.content for b in await memory.working(user_id=None)] == ["anonymous visitor"]


async def test_lessons_of_a_session_whose_spawn_named_the_agent_type_become_facts(
    memory: Memory, redis: Redis, um_settings: Settings, engine: AsyncEngine
) -> None:
    async with running_worker(um_settings):
        client = LifecycleClient(redis, um_settings)
        spawned = await client.spawn(
            PROJECT, "s-1", "agent-1", user_id="alice", agent_type_id="migrator"
        )
        await client.wait(spawned, timeout=20)
        ended = await client.terminate(
            PROJECT, "s-1", "agent-1", task_description="move", lessons_learned=["test first"]
        )
        await client.wait(ended, timeout=20)
    await Consolidator(um_settings, redis, engine).run_once()
    extracting = Memory(
        PROJECT, settings=um_settings, engine=engine, redis=redis, consolidator=LessonsExtractor()
    )
    await extracting.consolidate()
    facts = await memory.facts.query(user_id="alice")
    assert [(f.subject, f.object) for f in facts] == [("agent_type:migrator", "test first")]
