"""Bounds at the stream door, on real Redis with the worker running: every field of an entry and
of its command has a bound, a dead letter keeps an excerpt of a huge entry, the DLQ is trimmed
and shows in ``memworker stats``."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from schemas.commands import MAX_SESSION_TTL_SECONDS, MAX_TRACEPARENT_BYTES
from tests.helpers import (
    command,
    dead_letters,
    publish,
    results,
    running_worker,
    stream_len_at_least,
    wait_until,
)
from tests.integration.test_client_and_cli import memworker
from worker.consumers.dead_letters import EXCERPT_BYTES, redrive
from worker.keys import SessionKeys, StreamKeys
from worker.ops.capacity import measure_capacity
from worker.settings import Settings

MB = 1_048_576


async def xadd(redis: Redis, settings: Settings, fields: dict[str, Any]) -> None:
    await redis.xadd(StreamKeys(settings.stream_prefix, 0).lifecycle, fields)  # type: ignore[arg-type]


async def test_ten_megabytes_of_garbage_become_a_bounded_dead_letter(
    redis: Redis, settings: Settings
) -> None:
    """10 MB that are no command: dead-lettered as an excerpt that says what it was, not a
    32 MB copy; the good command after it still applies."""
    streams = StreamKeys(settings.stream_prefix, 0)
    garbage = os.urandom(10 * MB)
    await xadd(redis, settings, {"data": garbage})
    await publish(redis, settings, command("spawn", "after-garbage"))
    async with running_worker(settings):
        await stream_len_at_least(redis, streams.dlq, 1)
        await stream_len_at_least(redis, streams.results, 1)
    (letter,) = await dead_letters(redis, settings)
    assert letter["reason"] == "unparseable"
    assert letter["truncated"] == "true"
    assert int(letter["original_bytes"]) == len(garbage) + len("data")
    kept = orjson.loads(letter["data"])
    assert list(kept) == ["data"] and kept["data"]  # the start of what was sent, escaped
    used = int(await redis.memory_usage(streams.dlq) or 0)
    assert used < 8 * EXCERPT_BYTES, f"the DLQ holds {used} bytes for one dead letter"
    assert [r["causation_id"] for r in await results(redis, settings)] == ["after-garbage"]
    # Its excerpt is no entry to publish again: a redrive leaves it where it is.
    assert await redrive(redis, streams.dlq) == 0
    assert int(await redis.xlen(streams.dlq)) == 1
    assert int(await redis.xlen(streams.lifecycle)) == 2


async def test_an_entry_within_the_bound_is_dead_lettered_whole(
    redis: Redis, settings: Settings
) -> None:
    await xadd(redis, settings, {"data": b"{not json", "note": b"n" * 10_000})
    async with running_worker(settings):
        await stream_len_at_least(redis, StreamKeys(settings.stream_prefix, 0).dlq, 1)
    (letter,) = await dead_letters(redis, settings)
    assert letter["truncated"] == "false"
    assert orjson.loads(letter["data"]) == {"data": "{not json", "note": "n" * 10_000}


async def test_a_huge_traceparent_or_extra_field_is_refused_and_never_copied(
    redis: Redis, settings: Settings
) -> None:
    """A 1 MB traceparent (or a 2 MB field the worker ignores) beside a good command: the
    command is rejected limit_exceeded naming it, and the result carries none of it. A W3C
    traceparent is still copied."""
    good_trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await xadd(
        redis,
        settings,
        {
            "data": orjson.dumps(command("spawn", "huge-trace", session="t1")),
            "traceparent": "0" * MB,
        },
    )
    await xadd(
        redis,
        settings,
        {
            "data": orjson.dumps(command("spawn", "huge-junk", session="t2")),
            "junk": b"j" * (2 * MB),
        },
    )
    await xadd(
        redis,
        settings,
        {
            "data": orjson.dumps(command("spawn", "fine-trace", session="t3")),
            "traceparent": good_trace,
        },
    )
    streams = StreamKeys(settings.stream_prefix, 0)
    async with running_worker(settings):
        await stream_len_at_least(redis, streams.results, 3)
    rows: Any = await redis.xrange(streams.results)
    by_cause = {
        orjson.loads(f[b"data"])["causation_id"]: (orjson.loads(f[b"data"]), f) for _i, f in rows
    }
    trace_result, trace_fields = by_cause["huge-trace"]
    assert (trace_result["type"], trace_result["reason"]) == ("command.rejected", "limit_exceeded")
    assert (
        "traceparent" in trace_result["detail"]
        and str(MAX_TRACEPARENT_BYTES) in trace_result["detail"]
    )
    assert b"traceparent" not in trace_fields
    junk_result, _junk_fields = by_cause["huge-junk"]
    assert (junk_result["type"], junk_result["reason"]) == ("command.rejected", "limit_exceeded")
    assert "stream entry" in junk_result["detail"]
    fine_result, fine_fields = by_cause["fine-trace"]
    assert fine_result["type"] == "agent.spawned"
    assert fine_fields[b"traceparent"] == good_trace.encode()
    assert int(await redis.memory_usage(streams.results) or 0) < 64 * 1024
    for session in ("t1", "t2"):  # nothing of the refused spawns was stored
        keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", session)
        assert await redis.hget(keys.meta, "state") is None  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"ttl_seconds": 2**62}, "ttl_seconds"),
        ({"ttl_seconds": MAX_SESSION_TTL_SECONDS + 1}, "ttl_seconds"),
        ({"seq": 2**60}, "seq"),
    ],
)
async def test_a_spawn_over_a_numeric_bound_is_rejected_naming_the_field(
    redis: Redis, settings: Settings, fields: dict[str, Any], named: str
) -> None:
    await publish(redis, settings, command("spawn", "too-big", session="forever", **fields))
    async with running_worker(settings):
        await stream_len_at_least(redis, StreamKeys(settings.stream_prefix, 0).results, 1)
    (row,) = await results(redis, settings)
    assert (row["type"], row["reason"]) == ("command.rejected", "invalid_event")
    assert named in row["detail"]
    keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", "forever")
    assert await redis.exists(keys.meta, keys.vars) == 0


async def test_a_spawn_at_the_ttl_maximum_expires_within_it(
    redis: Redis, settings: Settings
) -> None:
    body = command("spawn", "longest", session="long", ttl_seconds=MAX_SESSION_TTL_SECONDS)
    await publish(redis, settings, body)
    async with running_worker(settings):
        await stream_len_at_least(redis, StreamKeys(settings.stream_prefix, 0).results, 1)
    (row,) = await results(redis, settings)
    assert row["type"] == "agent.spawned"
    keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", "long")
    ttl_ms = int(await redis.pttl(keys.meta))
    assert 0 < ttl_ms <= MAX_SESSION_TTL_SECONDS * 1000


async def test_the_dlq_is_trimmed_by_length_and_age_by_the_retention_pass(
    redis: Redis, settings: Settings
) -> None:
    quick = settings.model_copy(
        update={
            "dlq_max_entries": 3,
            "dlq_retention_seconds": 3_600,
            "retention_interval_seconds": 0.2,
        }
    )
    streams = StreamKeys(quick.stream_prefix, 0)
    # A dead letter two hours old (as a worker wrote it then), past the age bound.
    await redis.xadd(streams.dlq, {"data": "{}", "reason": "unparseable"}, id="1000-0")
    for n in range(6):
        await xadd(redis, quick, {"data": f"junk {n}".encode()})
    async with running_worker(quick):

        async def trimmed() -> bool:
            rows: Any = await redis.xrange(streams.dlq)
            return len(rows) == 3 and all(i != b"1000-0" for i, _f in rows)

        await stream_len_at_least(redis, streams.lifecycle, 6)
        await wait_until(trimmed, timeout=20)
    kept = [json.loads(letter["data"])["data"] for letter in await dead_letters(redis, quick)]
    assert kept == ["junk 3", "junk 4", "junk 5"], "the newest are kept"


async def test_stats_shows_the_dead_letters_bytes_and_entries(
    redis: Redis, settings: Settings
) -> None:
    for n in range(4):
        await xadd(redis, settings, {"data": f"junk {n}".encode()})
    async with running_worker(settings) as worker:
        await stream_len_at_least(redis, StreamKeys(settings.stream_prefix, 0).dlq, 4)
        await worker.probe_lag()  # the capacity gauges
    assert REGISTRY.get_sample_value("memworker_redis_dead_letters") == 4
    assert (REGISTRY.get_sample_value("memworker_redis_dead_letter_bytes") or 0) > 0
    capacity = await measure_capacity(redis, settings, rate_seconds=0)
    assert capacity.dead_letter_entries == 4
    used = int(await redis.memory_usage(StreamKeys(settings.stream_prefix, 0).dlq) or 0)
    assert capacity.dead_letter_bytes == used > 0
    table = await asyncio.to_thread(memworker, settings, "stats", "--rate-seconds", "0")
    assert table.returncode == 0, table.stderr
    assert "dead letters: 4 (" in table.stdout


async def test_the_consolidator_trims_the_indexers_and_the_change_feeds_dlqs(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    from tests.integration.results_factory import migrated_engine
    from worker.consolidation.consolidator import Consolidator
    from worker.keys import changes_dlq, episodes_dlq

    quick = settings.model_copy(update={"dlq_max_entries": 2, "database_url": database_url})
    dlqs = [episodes_dlq(quick.stream_prefix), changes_dlq(quick.stream_prefix)]
    for dlq in dlqs:
        await redis.xadd(dlq, {"data": "{}", "reason": "old"}, id="1000-0")  # past 7 days
        for n in range(4):
            await redis.xadd(dlq, {"data": "{}", "reason": f"r{n}"})
    async with migrated_engine(database_url) as engine:
        assert await Consolidator(quick, redis, engine).trim_once() >= 6
    for dlq in dlqs:
        rows: Any = await redis.xrange(dlq)
        assert [f[b"reason"] for _i, f in rows] == [b"r2", b"r3"]


async def test_the_client_refuses_a_traceparent_over_the_bound_and_publishes_nothing(
    redis: Redis, settings: Settings
) -> None:
    from worker.client import LifecycleClient

    client = LifecycleClient(redis, settings)
    spawn = command("spawn", "traced", session="s1")
    with pytest.raises(ValueError, match="traceparent is 600 bytes"):
        await client.publish(spawn, traceparent="0" * 600)
    assert int(await redis.xlen(StreamKeys(settings.stream_prefix, 0).lifecycle)) == 0
