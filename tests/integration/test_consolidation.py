"""The consolidator against real Redis and Postgres: rows exactly once, junk to the DLQ."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from tests import servers
from tests.integration.disposable_postgres import DisposablePostgres
from tests.integration.results_factory import (
    migrated_engine,
    publish,
    publish_raw,
    session_story,
    terminated,
)
from worker.consolidation.consolidator import Consolidator
from worker.db.models import Episode, LifecycleEvent, episode_id_for
from worker.keys import CONSOLIDATION_GROUP, StreamKeys, episodes_stream
from worker.settings import Settings


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    async with migrated_engine(database_url) as engine:
        yield engine


def make_consolidator(
    settings: Settings, redis: Redis, engine: AsyncEngine, **kw: Any
) -> Consolidator:
    kw.setdefault("backoff_initial_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    return Consolidator(settings, redis, engine, **kw)


async def wait_until(
    condition: Callable[[], Awaitable[bool]], seconds: float, interval: float = 0.05
) -> None:
    """Poll ``condition`` until it holds; fail after ``seconds``."""
    async with asyncio.timeout(seconds):
        while True:
            if await condition():
                return
            await asyncio.sleep(interval)


async def count(engine: AsyncEngine, model: type[Episode] | type[LifecycleEvent]) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(model))).scalar_one())


async def recorded_events(redis: Redis, settings: Settings) -> list[dict[str, Any]]:
    entries: Any = await redis.xrange(episodes_stream(settings.stream_prefix))
    return [orjson.loads(fields[b"data"]) for _id, fields in entries]


async def dead_letters(redis: Redis, settings: Settings) -> list[dict[str, str]]:
    letters: list[dict[str, str]] = []
    for shard in range(settings.shards):
        entries: Any = await redis.xrange(StreamKeys(settings.stream_prefix, shard).dlq)
        for _id, fields in entries:
            letters.append({k.decode(): v.decode() for k, v in fields.items()})
    return letters


async def pending(redis: Redis, settings: Settings) -> int:
    total = 0
    for shard in range(settings.shards):
        info = await redis.xpending(
            StreamKeys(settings.stream_prefix, shard).results, CONSOLIDATION_GROUP
        )
        total += int(info["pending"])
    return total


async def test_every_result_is_appended_to_lifecycle_events(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    story = session_story("proj-a", "sess-1")
    await publish(redis, settings, story)

    finished = await make_consolidator(settings, redis, engine).run_once()

    assert finished == len(story)
    async with AsyncSession(engine) as session:
        rows = (
            await session.scalars(select(LifecycleEvent).order_by(LifecycleEvent.occurred_at))
        ).all()
    assert [row.event_id for row in rows] == [r["event_id"] for r in story]
    assert [row.type for row in rows] == [r["type"] for r in story]
    for event, result in zip(rows, story, strict=True):
        # the snapshot is kept once, in episodes.snapshot
        assert event.payload == {k: v for k, v in result.items() if k != "snapshot"}
        assert (event.project_id, event.session_id, event.causation_id) == (
            "proj-a",
            "sess-1",
            result["causation_id"],
        )
    assert await pending(redis, settings) == 0


async def test_a_rejection_without_a_project_is_still_logged(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    from tests.integration.results_factory import base_result

    rejected = base_result(
        "command.rejected", None, None, reason="invalid_event", detail="no project_id", command=None
    )
    await publish(redis, settings, [rejected])
    assert await make_consolidator(settings, redis, engine).run_once() == 1
    assert await count(engine, LifecycleEvent) == 1


async def test_an_episode_is_written_per_termination_with_consolidate_only(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    kept = [terminated("proj-a", f"s-{i}", i) for i in range(5)]
    skipped = [terminated("proj-a", f"t-{i}", i, consolidate=False) for i in range(3)]
    await publish(redis, settings, kept + skipped)

    await make_consolidator(settings, redis, engine).run_once()

    async with AsyncSession(engine) as session:
        episodes = (await session.scalars(select(Episode))).all()
    assert sorted(e.source_event_id for e in episodes) == sorted(r["event_id"] for r in kept)
    episode = next(e for e in episodes if e.source_event_id == kept[0]["event_id"])
    assert episode.id == episode_id_for(kept[0]["event_id"])
    assert episode.project_id == "proj-a"
    assert episode.session_id == "s-0"
    assert episode.agent_instance_id == "agent-s-0"
    assert episode.agent_type_id == "researcher"
    assert episode.outcome == "success"
    assert episode.lessons_learned == ["check the units first"]
    assert episode.snapshot == kept[0]["snapshot"]
    assert episode.tokens_used == 1234
    assert episode.importance_score == pytest.approx(0.7)
    assert episode.duration_seconds == pytest.approx(60.0)
    assert "Summarise the quarterly sales report" in episode.context_summary
    assert "step 3/5" in episode.context_summary
    assert await count(engine, LifecycleEvent) == 8


async def test_replaying_the_same_results_twice_creates_no_second_row(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    results = [r for i in range(20) for r in session_story("proj-a", f"s-{i}", i * 10)]
    consolidator = make_consolidator(settings, redis, engine, batch_size=7)
    await publish(redis, settings, results)
    await consolidator.run_once()
    first = (await count(engine, LifecycleEvent), await count(engine, Episode))

    await publish(redis, settings, results)  # a replay: the same results, new stream entries
    await publish(redis, settings, results)
    assert await consolidator.run_once() == 2 * len(results)

    assert first == (100, 20)
    assert (await count(engine, LifecycleEvent), await count(engine, Episode)) == first


async def test_episode_recorded_is_published_once_per_new_episode(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    results = [terminated("proj-a", f"s-{i}", i) for i in range(30)]
    await publish(redis, settings, results)
    await make_consolidator(settings, redis, engine, batch_size=8).run_once()
    await publish(redis, settings, results)  # replayed: no new episode, no new event
    await make_consolidator(settings, redis, engine).run_once()

    events = await recorded_events(redis, settings)
    assert len(events) == 30
    by_source = {e["causation_id"]: e for e in events}
    assert set(by_source) == {r["event_id"] for r in results}
    first = by_source[results[0]["event_id"]]
    assert first["type"] == "episode.recorded"
    assert first["episode_id"] == str(episode_id_for(results[0]["event_id"]))
    assert (first["project_id"], first["session_id"]) == ("proj-a", "s-0")
    assert len({e["event_id"] for e in events}) == 30


async def test_a_refused_announcement_is_acknowledged_and_published_once_by_the_relay(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    stream = episodes_stream(settings.stream_prefix)
    await redis.set(stream, "not a stream")  # every XADD to it fails with WRONGTYPE
    results = [terminated("proj-a", f"s-{i}", i) for i in range(4)]
    await publish(redis, settings, results)
    consolidator = make_consolidator(settings, redis, engine, relay_grace_s=0.0)

    assert await consolidator.run_once() == 4
    assert await count(engine, Episode) == 4  # committed and acknowledged, announcement owed
    assert await pending(redis, settings) == 0
    assert await dead_letters(redis, settings) == []
    assert await consolidator.relay() == 0  # still refused: still owed

    await redis.delete(stream)
    assert await consolidator.relay() == 4
    assert await consolidator.relay() == 0
    await publish(redis, settings, results)  # a redelivery of announced episodes
    await consolidator.run_once()
    events = await recorded_events(redis, settings)
    assert sorted(e["causation_id"] for e in events) == sorted(r["event_id"] for r in results)
    async with engine.connect() as conn:
        unannounced = (
            select(func.count()).select_from(Episode).where(Episode.announced_at.is_(None))
        )
        assert (await conn.execute(unannounced)).scalar_one() == 0


async def test_episodes_a_crashed_consolidator_left_unannounced_are_announced_once_by_the_next(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    stream = episodes_stream(settings.stream_prefix)
    await redis.set(stream, "not a stream")  # the first one's XADD never gets out
    results = [terminated("proj-a", f"s-{i}", i) for i in range(30)]
    await publish(redis, settings, results)
    crashed = make_consolidator(settings, redis, engine, relay_sweep_interval_s=3600)
    await crashed.run_once()  # committed and acknowledged, then gone before any announcement
    await redis.delete(stream)

    after = make_consolidator(settings, redis, engine, relay_grace_s=0.0, block_ms=50)
    stop = asyncio.Event()
    task = asyncio.create_task(after.run(stop))
    try:
        await wait_until(lambda: _length_at_least(redis, stream, 30), 30)
        await asyncio.sleep(0.3)  # a few more turns of its loop: nothing more is published
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)

    events = await recorded_events(redis, settings)
    assert sorted(e["causation_id"] for e in events) == sorted(r["event_id"] for r in results)
    assert await pending(redis, settings) == 0


async def _length_at_least(redis: Redis, stream: str, n: int) -> bool:
    return int(await redis.xlen(stream)) >= n


async def test_junk_entries_go_to_the_dlq_and_the_rest_of_the_batch_lands(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    stream = StreamKeys(settings.stream_prefix, 0).results
    good = [terminated("proj-a", f"s-{i}", i) for i in range(3)]
    await publish(redis, settings, good[:1])
    not_json = await publish_raw(redis, stream, {"data": b"{not json"})
    not_object = await publish_raw(redis, stream, {"data": b"[1, 2]"})
    no_data = await publish_raw(redis, stream, {"payload": b"{}"})
    invalid = await publish_raw(
        redis, stream, {"data": orjson.dumps({"event_id": "x", "type": "agent.exploded"})}
    )
    no_ids = terminated("proj-a", "s-x", 0)
    no_ids["session_id"] = None
    await publish(redis, settings, [no_ids, *good[1:]])

    finished = await make_consolidator(settings, redis, engine).run_once()

    assert finished == 8
    letters = {letter["source_id"]: letter for letter in await dead_letters(redis, settings)}
    assert {k: v["reason"] for k, v in letters.items() if k != "x"} == {
        not_json: "unparseable",
        not_object: "unparseable",
        no_data: "unparseable",
        invalid: "invalid_result",
        **{
            k: "invalid_result"
            for k in letters
            if k not in {not_json, not_object, no_data, invalid}
        },
    }
    assert len(letters) == 5
    assert letters[not_json]["group"] == CONSOLIDATION_GROUP
    assert letters[not_json]["source_stream"] == stream
    assert orjson.loads(letters[not_json]["data"]) == {"data": "{not json"}
    assert await count(engine, Episode) == 3
    assert await pending(redis, settings) == 0


async def test_a_result_postgres_refuses_as_data_is_dead_lettered_at_once_alone(
    redis: Redis, prefix: str, redis_url: str, engine: AsyncEngine
) -> None:
    """A NUL byte is a data error (SQLSTATE 22): the same every time, so the one result is
    dead-lettered on its first delivery, naming the problem; the rest of its batch is stored."""
    settings = Settings(redis_url=redis_url, stream_prefix=prefix, consolidation_max_attempts=3)
    good = [terminated("proj-a", f"s-{i}", i) for i in range(40)]
    poison = terminated(
        "proj-a", "s-poison", 0, task_description="NUL \x00 is not text to Postgres"
    )
    await publish(redis, settings, [*good[:25], poison, *good[25:]])

    finished = await make_consolidator(settings, redis, engine, batch_size=50).run_once()

    assert finished == 41
    assert await count(engine, Episode) == 40
    letters = await dead_letters(redis, settings)
    assert [(letter["reason"], letter["deliveries"]) for letter in letters] == [
        ("unstorable_data", "1")
    ]
    assert letters[0]["error"].startswith("Postgres refused its data: ")
    assert orjson.loads(orjson.loads(letters[0]["data"])["data"])["event_id"] == poison["event_id"]
    assert await pending(redis, settings) == 0


async def test_faststream_envelopes_are_consolidated_too(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    from faststream.redis.parser.binary import BinaryMessageFormatV1

    result = terminated("proj-a", "s-fs", 0)
    envelope = await BinaryMessageFormatV1.encode(
        message=orjson.dumps(result), reply_to=None, headers={}, correlation_id="c-1"
    )
    await publish_raw(redis, StreamKeys(settings.stream_prefix, 0).results, {"__data__": envelope})
    await make_consolidator(settings, redis, engine).run_once()
    assert await count(engine, Episode) == 1


async def test_entries_a_dead_consumer_left_pending_are_reclaimed(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    consolidator = make_consolidator(settings, redis, engine, reclaim_idle_ms=0)
    await consolidator.ensure_groups()
    await publish(redis, settings, [terminated("proj-a", f"s-{i}", i) for i in range(10)])
    stream = StreamKeys(settings.stream_prefix, 0).results
    await redis.xreadgroup(CONSOLIDATION_GROUP, "died-mid-batch", {stream: ">"}, count=10)
    assert await pending(redis, settings) == 10

    await consolidator.run_once()

    assert await count(engine, Episode) == 10
    assert await pending(redis, settings) == 0


async def test_a_restarted_consumer_finishes_its_own_pending_entries_first(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    name = "replica-" + uuid.uuid4().hex[:6]
    first = make_consolidator(settings, redis, engine, consumer=name)
    await first.ensure_groups()
    await publish(redis, settings, [terminated("proj-a", f"s-{i}", i) for i in range(6)])
    stream = StreamKeys(settings.stream_prefix, 0).results
    await redis.xreadgroup(CONSOLIDATION_GROUP, name, {stream: ">"}, count=6)  # then "crashed"

    restarted = make_consolidator(settings, redis, engine, consumer=name)  # idle time not reached
    assert await restarted.run_once() == 6
    assert await count(engine, Episode) == 6


async def test_the_run_loop_consolidates_then_stops_when_asked(
    redis: Redis, prefix: str, redis_url: str, engine: AsyncEngine
) -> None:
    settings = Settings(redis_url=redis_url, stream_prefix=prefix, shards=3)
    results = [r for i in range(30) for r in session_story("proj-a", f"s-{i}", i * 10)]
    await publish(redis, settings, results)
    stop = asyncio.Event()
    task = asyncio.create_task(make_consolidator(settings, redis, engine, block_ms=50).run(stop))

    async def all_logged() -> bool:
        return await count(engine, LifecycleEvent) >= len(results)

    await wait_until(all_logged, 30)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert await count(engine, Episode) == 30
    assert await pending(redis, settings) == 0


@pytest.fixture
def own_postgres() -> Iterator[DisposablePostgres]:
    server = DisposablePostgres()
    try:
        server.start()
    except Exception as exc:
        server.cleanup()
        servers.unavailable("PostgreSQL of the test's own", str(exc))
    try:
        yield server
    finally:
        server.cleanup()


async def test_consolidation_survives_a_postgres_outage_without_losing_or_doubling_an_episode(
    redis: Redis, prefix: str, redis_url: str, own_postgres: DisposablePostgres
) -> None:
    settings = Settings(redis_url=redis_url, stream_prefix=prefix, shards=2)
    total = 5_000
    url = own_postgres.start()  # already running: returns its URL
    async with migrated_engine(url) as engine:
        await publish(redis, settings, [terminated("proj-a", f"s-{i}", i) for i in range(total)])
        consolidator = make_consolidator(
            settings, redis, engine, batch_size=100, block_ms=50, backoff_max_s=0.5
        )
        stop = asyncio.Event()
        task = asyncio.create_task(consolidator.run(stop))
        announced = episodes_stream(settings.stream_prefix)

        async def a_fifth_done() -> bool:
            return int(await redis.xlen(announced)) >= total // 5

        await wait_until(a_fifth_done, 60, interval=0.01)

        await asyncio.to_thread(own_postgres.kill)
        await asyncio.sleep(1.5)
        assert not task.done(), "the consolidator must wait for Postgres, not exit"
        assert await pending(redis, settings) > 0 or await redis.xlen(announced) < total
        await asyncio.to_thread(own_postgres.restart)

        async def all_done() -> bool:
            assert not task.done()
            return not await pending(redis, settings) and await count(engine, Episode) >= total

        await wait_until(all_done, 120)
        assert not task.done()
        stop.set()
        await asyncio.wait_for(task, 10)

        async with engine.connect() as conn:
            rows = await conn.execute(
                select(
                    func.count(),
                    func.count(func.distinct(Episode.source_event_id)),
                    func.count(Episode.announced_at),
                )
            )
            episodes, distinct_sources, announced_rows = rows.one()
        assert (episodes, distinct_sources, announced_rows) == (total, total, total)
        assert await count(engine, LifecycleEvent) == total
        events = await recorded_events(redis, settings)
        assert len({e["episode_id"] for e in events}) == total  # at least once each
        assert await dead_letters(redis, settings) == []


def counter(name: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name) or 0.0


async def test_each_counter_equals_the_work_done_when_two_writers_announce_at_once(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    # 600 terminates in one batch: written as two transactions at once (two writers), each
    # announcing its episodes; the counters must count both writers' work.
    results = [terminated("proj-a", f"s-{i}", i) for i in range(600)]
    await publish(redis, settings, results)
    recorded, stored = (
        counter("memworker_episodes_recorded_total"),
        counter("memworker_results_consolidated_total"),
    )
    consolidator = make_consolidator(settings, redis, engine, batch_size=600, writers=2)
    assert await consolidator.run_once() == 600

    announced = await redis.xlen(episodes_stream(settings.stream_prefix))
    assert announced == 600 == await count(engine, Episode)
    assert counter("memworker_episodes_recorded_total") - recorded == announced
    assert counter("memworker_results_consolidated_total") - stored == 600


async def test_results_replay_counts_every_episode_it_announces(
    redis: Redis, settings: Settings, engine: AsyncEngine
) -> None:
    from worker.consolidation.replay import ResultReplayer
    from worker.consumers.loop import StreamEntry

    stream = episodes_stream(settings.stream_prefix)
    await redis.set(stream, "not a stream")  # the first pass stores, but cannot announce
    results = [terminated("proj-a", f"s-{i}", i) for i in range(600)]
    await publish(redis, settings, results)
    first = make_consolidator(settings, redis, engine, batch_size=600, relay_sweep_interval_s=3600)
    await first.run_once()
    await redis.delete(stream)

    results_stream = StreamKeys(settings.stream_prefix, 0).results
    entries: Any = await redis.xrange(results_stream)
    replayer = ResultReplayer(redis, settings, engine, publish_to=None)
    await replayer.replay(
        [
            StreamEntry(results_stream, i.decode(), {k.decode(): v for k, v in f.items()})
            for i, f in entries
        ]
    )
    assert await redis.xlen(stream) == 600
    assert replayer.counts["new_episodes"] == 600
    assert replayer.counts["results"] == 600


async def test_the_consolidator_trims_the_episodes_stream_but_never_what_a_group_has_not_read(
    redis: Redis, redis_url: str, prefix: str, engine: AsyncEngine
) -> None:
    settings = Settings(
        redis_url=redis_url,
        stream_prefix=prefix,
        retention_seconds=0.5,
        retention_interval_seconds=0.1,
    )
    stream = episodes_stream(prefix)
    await redis.xgroup_create(stream, "done-reader", id="0", mkstream=True)
    await redis.xgroup_create(stream, "late-reader", id="0")
    results = [terminated("proj-a", f"s-{i}", i) for i in range(40)]
    await publish(redis, settings, results)
    consolidator = make_consolidator(settings, redis, engine, block_ms=50)

    async def read_all(group: str) -> None:
        reply: Any = await redis.xreadgroup(group, "me", {stream: ">"}, count=1000)
        ids = [entry_id for entry_id, _ in reply[0][1]] if reply else []
        if ids:
            await redis.xack(stream, group, *ids)

    stop = asyncio.Event()
    task = asyncio.create_task(consolidator.run(stop))
    try:
        await wait_until(lambda: _length_at_least(redis, stream, 40), 30)
        await read_all("done-reader")
        await asyncio.sleep(1.5)  # three retention windows, many trims
        # "late-reader" has read nothing: every announcement stays for it.
        assert await redis.xlen(stream) == 40
        await read_all("late-reader")

        async def trimmed() -> bool:
            return int(await redis.xlen(stream)) == 0

        await wait_until(trimmed, 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert await count(engine, Episode) == 40
