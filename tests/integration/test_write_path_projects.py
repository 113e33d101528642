"""The write path of several projects at once: concurrent ``remember`` calls of ``Memory``
instances of three projects on one engine are one round, one INSERT statement; per turn the
same results as a round of one project (a conflict fails its own call, a repeat is the same
turn, another project's turn of the same user and id is another turn), and each project's
change feed has one ``episode.remembered`` per new turn, in the order of its calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.helpers import poison_refused
from worker.keys import changes_stream, episodes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode
from worker.user_memory.turns import EpisodeConflictError

PROJECTS = ("tenant-a", "tenant-b", "tenant-c")


def turn(turn_id: str, user: str | None, words: str = "booked the train to porto") -> Episode:
    return Episode(id=turn_id, session_id=f"s-{user}", user_id=user, input=words, output="ok")


@contextlib.contextmanager
def inserts(engine: AsyncEngine) -> Iterator[list[str]]:
    """The statements inserting turns into ``episodes`` while in the block."""
    seen: list[str] = []

    def listen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "INSERT INTO episodes" in statement:
            seen.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", listen)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", listen)


async def feed(redis: Redis, settings: Settings, project: str) -> list[tuple[str | None, str]]:
    """The project's ``episode.remembered`` events: (user, turn id), in feed order."""
    stream = changes_stream(settings.stream_prefix, project, settings.shards)
    entries: Any = await redis.xrange(stream)
    events = [orjson.loads(f[b"data"]) for _id, f in entries]
    return [
        (e["user_id"], e["episode_id"])
        for e in events
        if e["type"] == "episode.remembered" and e["project_id"] == project
    ]


async def stored(engine: AsyncEngine) -> dict[tuple[str, str | None, str], str]:
    """Every turn's input by (project, user, id); and nothing owed left."""
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT project_id, user_id, turn_id, input FROM episodes"))
        owed = await conn.scalar(text("SELECT count(*) FROM memory_changes"))
    assert owed == 0, "an event still owed"
    return {(r.project_id, r.user_id, r.turn_id): r.input for r in rows}


async def test_three_projects_in_one_round_are_one_statement_with_per_turn_results(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    a, b, c = PROJECTS
    async with contextlib.AsyncExitStack() as stack:
        memory = {
            p: await stack.enter_async_context(
                Memory(p, settings=write_settings, engine=engine, redis=redis)
            )
            for p in PROJECTS
        }
        await memory[a].remember(turn("t1", "ann", "first words"))
        calls: list[tuple[str, Episode]] = []
        for n in range(4):  # the projects' calls interleaved
            calls += [(p, turn(f"{p}-{n}", f"u{n % 2}")) for p in PROJECTS]
        calls += [
            (b, turn("t1", "ann", "b's own words")),  # a's user and id in b: another turn
            (c, turn("t1", "ann", "c's own words")),
            (a, turn("t1", "ann", "first words")),  # a repeat: the stored turn
            (a, turn("t1", "ann", "other words")),  # a conflict: this call alone fails
            (b, turn("anon", None, "nobody's")),  # the anonymous bucket, per project too
            (c, turn("anon", None, "nobody's")),
            (c, turn(f"{c}-0", "u0")),  # a repeat within the round
        ]
        with inserts(engine) as seen:
            got = await asyncio.gather(
                *(memory[p].remember(e) for p, e in calls), return_exceptions=True
            )
        assert len(seen) == 1, "one INSERT for a round of three projects"
    conflict = got.pop(len(calls) - 4)
    assert isinstance(conflict, EpisodeConflictError), conflict
    assert "already remembered with other content" in str(conflict)
    assert got == [e.id for p, e in calls if "other" not in e.input]

    rows = await stored(engine)
    for p in PROJECTS:
        news = [(e.user_id, e.id) for q, e in calls if q == p and "-" in e.id]
        assert all(rows[p, *key] == "booked the train to porto" for key in news)
    assert rows[a, "ann", "t1"] == "first words"
    assert rows[b, "ann", "t1"] == "b's own words"
    assert rows[c, "ann", "t1"] == "c's own words"
    assert rows[b, None, "anon"] == rows[c, None, "anon"] == "nobody's"
    assert len(rows) == 12 + 1 + 2 + 2

    for p in PROJECTS:  # one event per new turn, in the order of the project's calls
        expected: list[tuple[str | None, str]] = [("ann", "t1")] if p == a else []
        for q, e in calls:
            if q == p and (e.user_id, e.id) not in expected:
                expected.append((e.user_id, e.id))
        assert await feed(redis, write_settings, p) == expected, p
    recorded = await redis.xlen(episodes_stream(write_settings.stream_prefix))
    assert recorded == len(rows), "every new turn announced once to the indexer"


async def test_a_turn_postgres_refuses_in_a_round_of_projects_fails_its_own_call(
    engine: AsyncEngine, redis: Redis, write_settings: Settings
) -> None:
    """The round's statement refused (a trigger stands for what the input rule might miss):
    each turn alone, so the other projects' turns are stored and on their feeds."""
    async with poison_refused(engine):
        async with contextlib.AsyncExitStack() as stack:
            memory = {
                p: await stack.enter_async_context(
                    Memory(p, settings=write_settings, engine=engine, redis=redis)
                )
                for p in PROJECTS
            }
            calls = [(p, turn(f"{p}-{n}", "ann")) for n in range(3) for p in PROJECTS]
            calls.insert(4, (PROJECTS[1], turn("bad", "ann", "poison")))
            with inserts(engine) as seen:
                got = await asyncio.gather(
                    *(memory[p].remember(e) for p, e in calls), return_exceptions=True
                )
            assert len(seen) == 1 + len(calls), "the round's statement, then each turn alone"
        [refused] = [g for g in got if isinstance(g, Exception)]
        assert "poison refused" in str(refused)
        assert [g for g in got if isinstance(g, str)] == [e.id for _p, e in calls if e.id != "bad"]
        assert len(await stored(engine)) == 9
        for p in PROJECTS:
            assert await feed(redis, write_settings, p) == [("ann", f"{p}-{n}") for n in range(3)]
