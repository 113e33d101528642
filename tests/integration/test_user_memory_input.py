"""``worker.Memory``'s door: bad arguments are refused with an ``InvalidInputError`` (a
``ValueError``) naming the argument, before anything is written, never a raw ``DBAPIError`` or
an ``AttributeError``, never a silent ``[]``; what the rule allows at its edges is stored and
found (a turn of 256 KiB of distinct words, a 32 KiB query)."""

from __future__ import annotations

import itertools
import string
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from schemas.inputs import InvalidInputError
from schemas.limits import MAX_QUERY_BYTES, MAX_TURN_TEXT_BYTES
from tests.integration.results_factory import migrated_engine
from tests.integration.test_cli_user_memory import run
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, Fact

PROJECT = "proj-input"
T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(database_url) as engine:
        yield engine


@pytest.fixture
async def memory(
    engine: AsyncEngine, redis: Redis, redis_url: str, prefix: str, database_url: str
) -> AsyncIterator[Memory]:
    settings = Settings(redis_url=redis_url, stream_prefix=prefix, database_url=database_url)
    async with Memory(PROJECT, settings=settings, engine=engine, redis=redis) as memory:
        yield memory


def distinct_words(size: int) -> str:
    words = ("".join(w) for w in itertools.product(string.ascii_lowercase, repeat=4))
    out: list[str] = []
    total = 0
    for word in words:
        if total + len(word) + 1 > size:
            break
        out.append(word)
        total += len(word) + 1
    return " ".join(out)


async def rows(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        counts = {}
        for table in ("episodes", "facts", "memory_blocks", "memory_changes"):
            found = await conn.execute(text(f"SELECT count(*) FROM {table}"))
            counts[table] = int(found.scalar_one())
        return counts


def turn(**fields: Any) -> Episode:
    values: dict[str, Any] = {
        "session_id": "chat-1",
        "user_id": "ann",
        "input": "Find me a train to Lisbon",
        "output": "The 08:12 from Madrid.",
        "occurred_at": T,
    }
    return Episode.model_validate(values | fields)


TIMES = ("occurred_at", "valid_from")
"""Refused when the model is built (``When``: ``schemas.inputs.parse_when``), a ``ValueError``."""

BAD_TURNS = [
    ("input", {"input": "a\x00b"}),
    ("output", {"output": "lone \ud800 surrogate"}),
    ("input", {"input": distinct_words(1 << 20)}),  # Postgres: string too long for tsvector
    ("input", {"input": "x" * 200_000, "output": "y" * 100_000}),  # together past the cap
    ("session_id", {"session_id": "*"}),
    ("session_id", {"session_id": "%"}),
    ("session_id", {"session_id": "../chat-a"}),
    ("session_id", {"session_id": "ｃｈａｔ"}),  # fullwidth look-alikes
    ("session_id", {"session_id": "a\x00"}),
    ("id", {"id": "turn/1"}),
    ("id", {"id": "t" * 129}),
    ("occurred_at", {"occurred_at": datetime.fromisoformat("0001-01-01T00:00:00+14:00")}),
    ("occurred_at", {"occurred_at": datetime.fromisoformat("9999-12-31T23:59:59-14:00")}),
]


@pytest.mark.parametrize(("field", "fields"), BAD_TURNS, ids=[f for f, _ in BAD_TURNS])
async def test_remember_refuses_a_bad_turn_naming_the_field_and_stores_nothing(
    memory: Memory, engine: AsyncEngine, field: str, fields: dict[str, Any]
) -> None:
    before = await rows(engine)
    if field in TIMES:  # a time the stores cannot hold is refused by the model itself
        with pytest.raises(ValidationError) as invalid:
            turn(**fields)
        assert invalid.value.errors()[0]["loc"] == (field,)
        assert await rows(engine) == before
        return
    with pytest.raises(InvalidInputError) as refused:
        await memory.remember(turn(**fields))
    assert refused.value.field == field
    assert str(refused.value).startswith(field)
    assert "\n" not in str(refused.value) and "SELECT" not in str(refused.value)
    assert await rows(engine) == before


async def test_a_turn_at_the_size_cap_of_distinct_words_is_stored_and_found(
    memory: Memory,
) -> None:
    words = distinct_words(MAX_TURN_TEXT_BYTES)
    assert len(words.encode()) <= MAX_TURN_TEXT_BYTES
    remembered = await memory.remember(turn(input=words, output=""))
    [match] = await memory.recall_scored(words.split()[-1], user_id="ann", limit=1)
    assert match.episode.id == remembered and match.bm25_score


BAD_FACTS = [
    ("object", {"object": ""}),
    ("object", {"object": "   "}),
    ("subject", {"subject": "a\x00b"}),
    ("object", {"object": "\udc80"}),
    ("predicate", {"predicate": "!!!"}),  # nothing left once normalised
    ("subject", {"subject": "s" * 5000}),
    ("confidence", {"confidence": float("nan")}),
    ("valid_from", {"valid_from": datetime.fromisoformat("0001-01-01T00:00:00+14:00")}),
    ("id", {"id": "fact*"}),
]


@pytest.mark.parametrize(("field", "fields"), BAD_FACTS, ids=[f for f, _ in BAD_FACTS])
async def test_facts_append_refuses_a_bad_fact_naming_the_field_and_stores_nothing(
    memory: Memory, engine: AsyncEngine, field: str, fields: dict[str, Any]
) -> None:
    values: dict[str, Any] = {
        "user_id": "ann",
        "subject": "ann",
        "predicate": "lives_in",
        "object": "Lisbon",
    }
    before = await rows(engine)
    if field in TIMES:  # a time the stores cannot hold is refused by the model itself
        with pytest.raises(ValidationError) as invalid:
            Fact.model_validate(values | fields)
        assert invalid.value.errors()[0]["loc"] == (field,)
        assert await rows(engine) == before
        return
    with pytest.raises(InvalidInputError) as refused:
        await memory.facts.append(Fact.model_validate(values | fields))
    assert refused.value.field == field
    assert await rows(engine) == before


BAD_RECALLS: list[tuple[str, Any, dict[str, Any]]] = [
    ("limit", "trains", {"limit": 0}),
    ("limit", "trains", {"limit": -1}),
    ("limit", "trains", {"limit": 10**12}),
    ("kind", "trains", {"kind": "bogus"}),
    ("query", None, {}),
    ("query", 42, {}),
    ("query", "   ", {}),
    ("query", "a\x00b", {}),
    ("query", "x" * (MAX_QUERY_BYTES + 1), {}),
    ("query", distinct_words(1 << 20), {}),
    ("time_range", "trains", {"time_range": (T, "tomorrow")}),
]


@pytest.mark.parametrize(
    ("field", "query", "arguments"), BAD_RECALLS, ids=[f for f, _, _ in BAD_RECALLS]
)
@pytest.mark.parametrize("method", ["recall", "recall_scored"])
async def test_recall_refuses_bad_arguments_naming_them(
    memory: Memory, method: str, field: str, query: Any, arguments: dict[str, Any]
) -> None:
    """Before: ``limit`` 0 or -1 and ``kind="bogus"`` gave a silent ``[]``, ``None`` an
    ``AttributeError``, a 1 MB query 12 s and then a raw ``DBAPIError``."""
    await memory.remember(turn())
    with pytest.raises(InvalidInputError) as refused:
        await getattr(memory, method)(query, user_id="ann", **arguments)
    assert refused.value.field == field


async def test_recall_keeps_loomflows_empty_query_and_takes_a_long_one(memory: Memory) -> None:
    remembered = await memory.remember(turn())
    assert [e.id for e in await memory.recall("", user_id="ann")] == [remembered]
    long = "train " + distinct_words(MAX_QUERY_BYTES - 10)
    assert len(long.encode()) <= MAX_QUERY_BYTES
    found = await memory.recall_scored(long, user_id="ann", kind="semantic")
    assert [m.episode.id for m in found] == [remembered]


@pytest.mark.parametrize(
    ("field", "arguments"),
    [
        ("limit", {"limit": -1}),
        ("limit", {"limit": 0}),
        ("session_id", {"session_id": "../chat-1"}),
    ],
)
async def test_session_messages_refuses_bad_arguments(
    memory: Memory, field: str, arguments: dict[str, Any]
) -> None:
    """Before: ``limit=-1`` was ignored (one turn came back)."""
    await memory.remember(turn())
    call = {"session_id": "chat-1", "user_id": "ann"} | arguments
    with pytest.raises(InvalidInputError) as refused:
        await memory.session_messages(**call)
    assert refused.value.field == field


async def test_recall_facts_and_blocks_refuse_bad_arguments(
    memory: Memory, engine: AsyncEngine
) -> None:
    before = await rows(engine)
    for call, field in [
        (memory.recall_facts("x", limit=0, user_id="ann"), "limit"),
        (memory.recall_facts("\x00", user_id="ann"), "query"),
        (memory.update_block("per*sona", "x", user_id="ann"), "name"),
        (memory.update_block("persona", "a\x00b", user_id="ann"), "content"),
        (memory.append_block("persona", "\ud800", user_id="ann"), "content"),
    ]:
        with pytest.raises(InvalidInputError) as refused:
            await call
        assert refused.value.field == field
    assert await rows(engine) == before


async def test_the_cli_shares_the_rule_and_says_which_argument_in_one_line(
    redis: Redis, redis_url: str, prefix: str, database_url: str
) -> None:
    """Before: ``memworker memory recall '   '`` printed the most recent turns, and a fact
    with a NUL in it a raw Postgres error."""
    async with migrated_engine(database_url):
        pass
    settings = Settings(redis_url=redis_url, stream_prefix=prefix, database_url=database_url)
    for args, stdin, field in [
        (["recall", "   ", "-u", "ann", "-p", "demo"], None, "query"),
        (["facts", "--add", "ann", "likes", "o" * 5000, "-u", "ann", "-p", "demo"], None, "object"),
        (
            ["blocks", "--set", "persona", "--content", "-", "-u", "ann", "-p", "demo"],
            "a\x00b",
            "content",
        ),
    ]:
        done = await run(settings, *args, stdin=stdin)
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert lines[-1].startswith(f"memworker: error: {field}: "), done.stderr


async def test_a_data_error_postgres_still_raises_is_bad_input_at_the_doors_not_an_outage(
    engine: AsyncEngine,
) -> None:
    """The doors' safety net: what the rule missed and Postgres refuses as data (SQLSTATE
    class 22, or 54: a limit such as a tsvector past 1 MB) is a 422, never the 503 that tells
    clients and load balancers the database is down."""
    from worker.access.scope import failure

    for statement, params in [
        ("SELECT CAST(:v AS text)", {"v": "a\x00b"}),
        ("SELECT to_tsvector('simple', :v)", {"v": distinct_words(1 << 20)}),
        ("SELECT CAST(:v AS int)", {"v": "x"}),
    ]:
        with pytest.raises(Exception) as raised:  # noqa: PT011 - whatever the driver raises
            async with engine.connect() as conn:
                await conn.execute(text(statement), params)
        status, line = failure(raised.value)
        assert status == 422, (status, line)
        assert line.startswith("invalid arguments: Postgres refused the data") and "\n" not in line
