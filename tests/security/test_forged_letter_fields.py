"""A publisher's command carrying, next to its ``data``, the fields of a dead letter
(``source_id``, ``source_stream``) is still a command: the worker applies it, and forget, export
and replay read it by its ``data`` and date it by its own stream id, on real Redis and
Postgres. Only an entry of a DLQ stream is a dead letter. Before, ``source_id abc`` made every
forget of every project and ``replay lifecycle`` crash (``int('abc')``), ``source_stream``
made the command read as a dead letter (with ``truncated true`` and ``original_project_id``
beside it, or a ``data`` inside its JSON, it named another project or none: hidden from every
forget and export), and ``source_id 1-0`` made a time-range forget judge it by that fake
time."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.helpers import running_worker, stream_len_at_least
from tests.integration.results_factory import migrated_engine
from worker.consumers.dead_letters import dead_letter, redrive
from worker.erasure.erased import load_erased
from worker.erasure.export import export_project
from worker.erasure.forget import forget_everywhere
from worker.keys import StreamKeys
from worker.lifecycle.replay import replay_lifecycle
from worker.settings import Settings

PROJECT = "demo"


def spawn(project: str, user: str, session: str, **extra: str) -> str:
    return json.dumps(
        {
            "event_id": f"{session}-spawn",
            "type": "spawn",
            "project_id": project,
            "session_id": session,
            "agent_instance_id": "a",
            "user_id": user,
            "initial_state": {"email": f"{user}@example.com"},
            **extra,
        }
    )


def terminate(project: str, session: str) -> str:
    return json.dumps(
        {
            "event_id": f"{session}-end",
            "type": "terminate",
            "project_id": project,
            "session_id": session,
            "agent_instance_id": "a",
            "consolidate": False,
        }
    )


async def held(redis: Redis, settings: Settings) -> bytes:
    """Every byte the shard's commands and results still hold."""
    keys = StreamKeys(settings.stream_prefix, 0)
    out = b""
    for stream in (keys.lifecycle, keys.results):
        rows: Any = await redis.xrange(stream)
        out += b"".join(v for _id, fields in rows for v in fields.values())
    return out


async def applied(redis: Redis, settings: Settings, commands: list[dict[str, str]]) -> None:
    """Publish ``commands`` on shard 0's lifecycle stream and run the worker until each has
    its result (none dead-lettered)."""
    keys = StreamKeys(settings.stream_prefix, 0)
    for fields in commands:
        await redis.xadd(keys.lifecycle, fields)  # type: ignore[arg-type]
    async with running_worker(settings):
        await stream_len_at_least(redis, keys.results, len(commands))
    rows: Any = await redis.xrange(keys.results)
    kinds = [json.loads(fields[b"data"])["type"] for _id, fields in rows]
    assert "command.rejected" not in kinds, kinds
    assert not await redis.exists(keys.dlq), "a command was dead-lettered"


async def test_a_command_with_a_source_id_that_is_no_stream_id_breaks_no_forget_nor_replay(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    live = settings.model_copy(update={"database_url": database_url, "shards": 1})
    await applied(
        redis,
        live,
        [
            {"data": spawn(PROJECT, "ivy", "ivy-s1"), "source_id": "abc"},
            {"data": spawn("other", "bob", "bob-s1")},
        ],
    )
    async with migrated_engine(database_url) as engine:
        receipt = await forget_everywhere(engine, redis, live.stream_prefix, "other", shards=1)
        assert receipt.ok, receipt.errors
        assert b"bob@example.com" not in await held(redis, live)
        counts = await replay_lifecycle(redis, live, 0)  # P:erased is not empty now
        assert counts == {"duplicate": 1}, counts  # ivy's spawn, applied once already
        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, shards=1, user_id="ivy"
        )
        assert receipt.ok, receipt.errors
    assert b"ivy@example.com" not in await held(redis, live), "ivy's spawn was kept"


@pytest.mark.parametrize(
    ("forged", "inner"),
    [
        ({"source_stream": "x"}, {}),
        ({"source_stream": "x", "truncated": "true", "original_project_id": "elsewhere"}, {}),
        ({"source_stream": "x"}, {"data": "{}"}),
    ],
    ids=["source_stream", "recorded-ids", "inner-data"],
)
async def test_a_command_with_a_source_stream_is_exported_and_forgotten(
    redis: Redis,
    settings: Settings,
    database_url: str,
    forged: dict[str, str],
    inner: dict[str, str],
) -> None:
    """``forged``: fields beside ``data``; ``inner``: fields in it (the worker ignores an
    unknown field; read as a dead letter, a ``data`` in it was taken for the original's)."""
    live = settings.model_copy(update={"database_url": database_url, "shards": 1})
    await applied(
        redis,
        live,
        [
            {"data": spawn(PROJECT, "kim", "kim-s1", **inner), **forged},
            {"data": spawn("proj2", "lee", "lee-s1", **inner), **forged},
            {"data": terminate(PROJECT, "kim-s1"), **forged},
            {"data": terminate("proj2", "lee-s1"), **forged},
        ],
    )
    lifecycle = StreamKeys(live.stream_prefix, 0).lifecycle
    async with migrated_engine(database_url) as engine:
        export = await export_project(
            engine, PROJECT, redis=redis, prefix=live.stream_prefix, user_id="kim"
        )
        exported = json.dumps(export.stream_entries.get(lifecycle, []))
        assert "kim@example.com" in exported, "export left out kim's spawn"
        assert "lee@example.com" not in exported
        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, shards=1, user_id="kim"
        )
        assert receipt.ok, receipt.errors
        assert b"kim@example.com" not in await held(redis, live), "kim's spawn was kept"
        assert b"lee@example.com" in await held(redis, live), "another project's went too"
        receipt = await forget_everywhere(engine, redis, live.stream_prefix, "proj2", shards=1)
        assert receipt.ok, receipt.errors
    assert b"lee@example.com" not in await held(redis, live), "proj2's spawn was kept"


async def test_a_range_forget_dates_a_command_by_its_own_id_not_a_source_id(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """``source_id 1-0``: the command says it was added in 1970; it was added now."""
    live = settings.model_copy(update={"database_url": database_url, "shards": 1})
    await redis.xadd(
        StreamKeys(live.stream_prefix, 0).lifecycle,
        {"data": spawn(PROJECT, "rex", "rex-s1"), "source_id": "1-0"},
    )
    now = datetime.now(UTC)
    async with migrated_engine(database_url) as engine:

        async def forget(since: datetime, before: datetime) -> None:
            receipt = await forget_everywhere(
                engine,
                redis,
                live.stream_prefix,
                PROJECT,
                shards=1,
                user_id="rex",
                since=since,
                before=before,
            )
            assert receipt.ok, receipt.errors

        await forget(datetime(1970, 1, 1, tzinfo=UTC), datetime(2000, 1, 1, tzinfo=UTC))
        assert b"rex@example.com" in await held(redis, live), "erased by a range before it"
        await forget(now - timedelta(hours=1), now + timedelta(minutes=1))
    assert b"rex@example.com" not in await held(redis, live), "kept by the range it is in"


async def test_a_dead_letter_whose_source_id_is_no_stream_id_is_dated_by_its_own(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """A letter on the DLQ with a broken ``source_id`` (none the worker writes): forget and
    the redrive date it by its own id, and neither crashes."""
    live = settings.model_copy(update={"database_url": database_url, "shards": 1})
    keys = StreamKeys(live.stream_prefix, 0)
    for user in ("kim", "lee"):
        letter = dead_letter(
            fields={"data": spawn(PROJECT, user, f"{user}-s1")},
            source_stream=keys.lifecycle,
            source_id="abc",
            group="lifecycle",
            reason="unparseable",
            error="test",
            deliveries=1,
        )
        await redis.xadd(keys.dlq, letter)  # type: ignore[arg-type]
    async with migrated_engine(database_url) as engine:
        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, shards=1, user_id="kim"
        )
    assert receipt.ok, receipt.errors
    assert receipt.streams == {keys.dlq: 1}, receipt.streams
    assert await redrive(redis, keys.dlq, erased=await load_erased(redis, live.stream_prefix)) == 1
    rows: Any = await redis.xrange(keys.lifecycle)
    assert [json.loads(f[b"data"])["user_id"] for _i, f in rows] == ["lee"]
