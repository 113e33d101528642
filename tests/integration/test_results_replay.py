"""`memworker replay results` from the stream and, older than its retention, from Postgres."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select, update

from tests.helpers import running_worker
from tests.integration.test_client_and_cli import memworker
from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.db.migrate import migrate
from worker.db.models import Episode, LifecycleEvent
from worker.keys import (
    SessionKeys,
    StreamKeys,
    changes_dlq,
    changes_stream,
    episodes_stream,
)
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings


@pytest.fixture
async def live(settings: Settings, database_url: str) -> Settings:
    await migrate(database_url)
    return settings.model_copy(update={"database_url": database_url})


async def run_sessions(redis: Redis, settings: Settings, project: str, sessions: int) -> None:
    """Spawn, pause, resume and terminate (consolidated) ``sessions`` sessions."""
    client = LifecycleClient(redis, settings)
    for n in range(sessions):
        s = f"{project}-s{n}"
        await client.wait(await client.spawn(project, s, "a", {"goal": f"goal {n}"}), timeout=10)
        await client.wait(await client.pause(project, s, "a"), timeout=10)
        await client.wait(await client.resume(project, s, "a"), timeout=10)
        sent = await client.terminate(
            project, s, "a", lessons_learned=[f"lesson {n}"], task_description=f"task {n}"
        )
        await client.wait(sent, timeout=10)


async def consolidate(settings: Settings) -> None:
    consolidator = Consolidator.from_settings(settings)
    try:
        await consolidator.run_once()
    finally:
        await consolidator.close()


async def forget_announcements(settings: Settings, project: str) -> None:
    """As if a crash had struck between COMMIT and the announcement of these episodes."""
    engine = create_database_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                update(Episode).where(Episode.project_id == project).values(announced_at=None)
            )
    finally:
        await engine.dispose()


async def table_counts(settings: Settings) -> tuple[int, int]:
    engine = create_database_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            events = (await conn.execute(select(func.count()).select_from(LifecycleEvent))).scalar()
            episodes = (await conn.execute(select(func.count()).select_from(Episode))).scalar()
            return int(events or 0), int(episodes or 0)
    finally:
        await engine.dispose()


async def published(redis: Redis, stream: str) -> list[dict[str, Any]]:
    rows: Any = await redis.xrange(stream)
    return [orjson.loads(fields[b"data"]) for _id, fields in rows]


async def replay(settings: Settings, *args: str) -> dict[str, int]:
    """``memworker replay results ARGS`` through the real CLI; its summary line."""
    return summary(await asyncio.to_thread(memworker, settings, "replay", "results", *args))


def summary(done: Any) -> dict[str, int]:
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    return {k: int(v) for k, v in (part.split("=") for part in last.split())}


async def test_results_trimmed_from_the_stream_replay_from_postgres_with_the_same_outcome(
    redis: Redis, live: Settings
) -> None:
    async with running_worker(live):
        await run_sessions(redis, live, "pa", 3)
    await consolidate(live)
    results_stream = StreamKeys(live.stream_prefix, 0).results
    originals = await published(redis, results_stream)
    assert len(originals) == 12
    await forget_announcements(live, "pa")
    announced_before = await redis.xlen(episodes_stream(live.stream_prefix))
    rows_before = await table_counts(live)

    from_stream = await replay(live, "--publish-to", f"{live.stream_prefix}:x1")
    assert from_stream == {"new_episodes": 3, "published": 12, "results": 12, "skipped": 0}

    # Retention trims every result (all consolidated); the announcements are owed again.
    await redis.xtrim(results_stream, maxlen=0, approximate=False)
    await forget_announcements(live, "pa")
    trimmed = await asyncio.to_thread(memworker, live, "replay", "results")
    assert "nothing to replay" in trimmed.stdout
    assert "older ones are in Postgres" in trimmed.stderr
    assert "--source postgres" in trimmed.stderr

    from_postgres = await replay(
        live, "--source", "postgres", "--since", "1h", "--publish-to", f"{live.stream_prefix}:x2"
    )
    assert from_postgres == from_stream
    assert (
        "replaying results"
        in (
            await asyncio.to_thread(
                memworker, live, "replay", "results", "--source", "postgres", "--since", "1h"
            )
        ).stderr
    ), "a progress bar, as from the stream"

    # The same results, snapshots included, in the same order; nothing stored twice.
    again = await published(redis, f"{live.stream_prefix}:x2")
    assert again == await published(redis, f"{live.stream_prefix}:x1")
    assert again == originals
    assert any("snapshot" in r for r in again)
    assert await table_counts(live) == rows_before
    # Each replay announced the three owed episodes once.
    assert await redis.xlen(episodes_stream(live.stream_prefix)) == announced_before + 6


async def test_replaying_from_postgres_twice_changes_nothing(redis: Redis, live: Settings) -> None:
    async with running_worker(live):
        await run_sessions(redis, live, "pa", 2)
    await consolidate(live)
    await forget_announcements(live, "pa")
    rows = await table_counts(live)
    first = await replay(live, "--source", "postgres")
    assert first == {"new_episodes": 2, "results": 8, "skipped": 0}
    announced = await redis.xlen(episodes_stream(live.stream_prefix))
    second = await replay(live, "--source", "postgres")
    assert second == {"new_episodes": 0, "results": 8, "skipped": 0}
    assert await redis.xlen(episodes_stream(live.stream_prefix)) == announced
    assert await table_counts(live) == rows


async def test_a_postgres_replay_keeps_to_its_project_and_time_range(
    redis: Redis, live: Settings
) -> None:
    async with running_worker(live):
        await run_sessions(redis, live, "pa", 1)
        await asyncio.sleep(0.05)
        between = datetime.now(UTC)
        await asyncio.sleep(0.05)
        await run_sessions(redis, live, "pb", 2)
    await consolidate(live)
    target = f"{live.stream_prefix}:x"
    done = await replay(live, "--source", "postgres", "--project", "pb", "--publish-to", target)
    assert done["results"] == 8
    assert {r["project_id"] for r in await published(redis, target)} == {"pb"}
    await redis.delete(target)

    done = await replay(
        live, "--source", "postgres", "--until", between.isoformat(), "--publish-to", target
    )
    assert done["results"] == 4
    assert {r["session_id"] for r in await published(redis, target)} == {"pa-s0"}
    # The same range by time, from the stream.
    await redis.delete(target)
    done = await replay(
        live, "--since", between.isoformat(), "--project", "pb", "--publish-to", target
    )
    assert done["results"] == 8
    assert {r["project_id"] for r in await published(redis, target)} == {"pb"}


def words(stderr: str) -> str:
    """Typer's usage error box, as one line of words."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", stderr).split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "postgres", "--from", "1-0"], "--since/--until"),
        (["--since", "yesterday"], "RFC 3339"),
        (["--source", "archive"], "stream or postgres"),
        (["--project", "a b"], "project_id"),
        (["--from", "yesterday"], "is not a stream id"),
    ],
)
def test_a_bad_replay_range_is_a_usage_error_naming_what_to_do(
    settings: Settings, args: list[str], message: str
) -> None:
    done = memworker(settings, "replay", "results", *args)
    assert done.returncode == 2
    assert message in words(done.stderr)


def test_results_may_not_be_republished_onto_the_command_stream(settings: Settings) -> None:
    lifecycle = StreamKeys(settings.stream_prefix, 0).lifecycle
    done = memworker(settings, "replay", "results", "--publish-to", lifecycle)
    assert done.returncode == 2
    assert "may not be published on a lifecycle or DLQ stream" in words(done.stderr)


def test_results_are_republished_only_on_a_named_stream_under_the_prefix(
    settings: Settings,
) -> None:
    """Before, ``--publish-to ''`` published on the empty-named key, and a stream outside the
    prefix was one no forget erases."""
    for target in ("", "elsewhere:x", f"{settings.stream_prefix}:", settings.stream_prefix):
        done = memworker(settings, "replay", "results", "--publish-to", target)
        assert done.returncode == 2, (target, done.stdout, done.stderr)
        said = words(done.stderr)
        assert "--publish-to" in said and f"under the prefix, {settings.stream_prefix}:" in said


async def test_results_are_republished_only_on_a_stream_of_their_own(
    redis: Redis, live: Settings
) -> None:
    """memworker's own keys (a session's ``meta``, ``P:erased``, the change feed, the results
    streams, a shard's counters …) and any key that is not a stream are refused, naming
    ``--publish-to``, and left as they were; a new stream, or one that is a stream, is taken.
    Before, the streams among them were written to (the consolidator's own input, the change
    feed, ``P:episodes``) and the others failed half-way (``WRONGTYPE``, exit status 1)."""
    async with running_worker(live):
        await run_sessions(redis, live, "pa", 1)
    p = live.stream_prefix
    meta = SessionKeys.for_session(p, live.shards, "pa", "s0").meta
    await redis.hset(meta, "state", "running")  # type: ignore[misc]
    await redis.hset(f"{p}:erased", "pa", "1")  # type: ignore[misc]
    await redis.set(f"{p}:notes", "an operator's string")
    own = [
        meta,
        f"{p}:erased",
        f"{p}:erased_ranges",
        f"{p}:erasure:owed",
        changes_stream(p, "pa", live.shards),
        changes_dlq(p),
        StreamKeys(p, 0).results,
        StreamKeys(p, 0).admission,
        episodes_stream(p),
        f"{p}:{{0}}:seq:pa/s0",
    ]
    for target in [*own, f"{p}:notes"]:
        before = await redis.type(target), await redis.dump(target)
        done = await asyncio.to_thread(memworker, live, "replay", "results", "--publish-to", target)
        assert done.returncode == 2, (target, done.stdout, done.stderr)
        said = words(done.stderr)
        assert "--publish-to" in said and ("own keys" in said or "not a stream" in said), said
        assert (await redis.type(target), await redis.dump(target)) == before, target
    await redis.xadd(f"{p}:replayed:old", {"data": b"{}"})
    for target in (f"{p}:replayed:new", f"{p}:replayed:old"):
        assert (await replay(live, "--publish-to", target))["published"] == 4, target
    assert await redis.xlen(f"{p}:replayed:new") == 4
    assert await redis.xlen(f"{p}:replayed:old") == 5


async def test_junk_in_the_results_stream_is_skipped_and_not_republished(
    redis: Redis, live: Settings
) -> None:
    async with running_worker(live):
        await run_sessions(redis, live, "pa", 1)
    await redis.xadd(StreamKeys(live.stream_prefix, 0).results, {"data": b"not json"})
    target = f"{live.stream_prefix}:x"
    done = await replay(live, "--publish-to", target)
    assert done == {"new_episodes": 1, "published": 4, "results": 4, "skipped": 1}
    assert [r["type"] for r in await published(redis, target)] == [
        "agent.spawned",
        "agent.paused",
        "agent.resumed",
        "agent.terminated",
    ]
