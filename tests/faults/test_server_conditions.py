"""Server-wide Redis conditions are never poison: a Redis the test owns is made full
(``maxmemory``, noeviction) or busy (a long script) while a backlog waits, then released.
Every command is applied exactly once, nothing is dead-lettered, no consumer exits, and each
reports not ready while the condition holds."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select

from tests.faults.full_redis import run_full_redis
from tests.faults.support import (
    assert_exactly_once,
    audit,
    ensure_groups,
    figures,
    pending,
    publish_many,
    session_command,
)
from tests.helpers import running_worker, wait_until, worker_env
from tests.integration.results_factory import migrated_engine, terminated
from tests.integration.results_factory import publish as publish_results
from tests.redis_process import RedisProcess
from worker.consolidation.consolidator import Consolidator
from worker.consumers.loop import ensure_group
from worker.consumers.retention import trim_stream
from worker.db.models import Episode
from worker.keys import (
    CONSOLIDATION_GROUP,
    SessionKeys,
    StreamKeys,
    episodes_stream,
    shard_of,
)
from worker.lifecycle.client import LifecycleClient
from worker.lifecycle.worker import LifecycleWorker
from worker.memory import RedisUnavailableError, WorkingMemory
from worker.metrics import REDIS_CONDITIONS, TRIMMED_WHILE_FULL
from worker.redis_conditions import RedisConditionError
from worker.settings import Settings

pytestmark = pytest.mark.faults

SESSIONS = 750  # spawn, pause, resume, terminate each: 3,000 commands


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path, persistent=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def client(own_redis: RedisProcess) -> AsyncIterator[Redis]:
    redis = Redis.from_url(own_redis.url)
    try:
        yield redis
    finally:
        await redis.aclose()


async def make_full(redis: Redis) -> None:
    """Cap Redis below what it already holds: every write that may grow memory is refused."""
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory-policy", "noeviction")
    await redis.config_set("maxmemory", str(used // 2))


async def publish_then_fill(redis: Redis, settings: Settings, bodies: list[Any]) -> None:
    """XADD a backlog and cap Redis below what it then holds, in one MULTI: the worker reads
    nothing of it before Redis is full."""
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory-policy", "noeviction")
    pipe = redis.pipeline(transaction=True)
    for body in bodies:
        shard = shard_of(body["project_id"], body["session_id"], settings.shards)
        pipe.xadd(StreamKeys(settings.stream_prefix, shard).lifecycle, {"data": orjson.dumps(body)})
    pipe.config_set("maxmemory", str(used))
    await pipe.execute()


async def uncap(redis: Redis) -> None:
    await redis.config_set("maxmemory", "0")


async def _maxmemory(redis: Redis) -> int:
    return int((await redis.info("memory"))["maxmemory"])


def seen(kind: str) -> float:
    return float(REDIS_CONDITIONS.labels(kind)._value.get())


async def test_a_backlog_held_by_a_full_redis_is_applied_exactly_once_when_memory_frees(
    own_redis: RedisProcess, client: Redis, prefix: str
) -> None:
    settings = Settings(
        redis_url=own_redis.url,
        stream_prefix=prefix,
        shards=2,
        max_deliveries=2,  # a single counted redelivery too many would dead-letter
        reclaim_idle_ms=300,  # reclaim runs often and would meet any lapsed lease
        reclaim_interval_ms=100,
        seq_gap_timeout_seconds=1.0,  # the condition outlasts it: the gap is not the sender's
    )
    await ensure_groups(client, settings)
    for shard in range(settings.shards):  # as a worker that ran before left them
        await ensure_group(client, StreamKeys(prefix, shard).results, CONSOLIDATION_GROUP)
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await wait_until(lambda: _true(worker.ready), timeout=30)
    full_before = seen("full")

    bodies = [session_command(f"s{n}", seq) for seq in (1, 2, 3, 4) for n in range(SESSIONS)]
    await publish_then_fill(client, settings, bodies)

    async def held_a_while() -> bool:
        assert not task.done(), "the worker must not exit"
        return seen("full") - full_before >= 30 and len(worker.retry.held) > 0

    await wait_until(held_a_while, timeout=120)
    assert not worker.ready
    report = await audit(client, settings)
    assert report.results == [] and report.dead == []

    await uncap(client)

    async def all_applied() -> bool:
        assert not task.done(), "the worker must not exit"
        return len((await audit(client, settings)).results) >= len(bodies)

    await wait_until(all_applied, timeout=180)
    await wait_until(lambda: _true(worker.ready), timeout=30)
    stop.set()
    await asyncio.wait_for(task, 30)

    report = await audit(client, settings)
    assert_exactly_once(report, [b["event_id"] for b in bodies])
    assert report.rejected == []  # no stale_seq, no gap: the order survived the condition
    assert report.dead == []
    assert await pending(client, settings) == 0


async def test_a_successor_retried_before_its_held_predecessor_is_not_dead_lettered_as_a_gap(
    own_redis: RedisProcess, client: Redis, prefix: str
) -> None:
    # Held entries are retried as their backoffs fall due, not in stream order: once Redis
    # serves again, a seq 3 can be applied before its seq 2. Its gap clock starts then, not
    # when the condition first held it (which, in CI, dead-lettered 500 good commands).
    settings = Settings(
        redis_url=own_redis.url,
        stream_prefix=prefix,
        shards=1,
        seq_gap_timeout_seconds=1.0,
        reclaim_idle_ms=3000,  # condition backoff capped at 1 s
    )
    await ensure_groups(client, settings)
    async with running_worker(settings) as worker:
        await publish_many(client, settings, [session_command(s, 1) for s in ("s0", "s1")])
        await wait_until(lambda: _results_at_least(client, settings, 2), timeout=30)

        later = [session_command("s0", 2), session_command("s0", 3), session_command("s1", 2)]
        await publish_then_fill(client, settings, later)
        await wait_until(lambda: _true(len(worker.retry.held) == 3), timeout=30)
        # held longer than the gap timeout
        await asyncio.sleep(2 * settings.seq_gap_timeout_seconds)
        assert not worker.ready
        (predecessor,) = [
            held for held in worker.retry.held.values() if b'"s0-2"' in held.fields[b"data"]
        ]
        predecessor.due = time.monotonic() + 3.0  # its backoff falls due after its successor's
        await uncap(client)

        await wait_until(lambda: _results_at_least(client, settings, 5), timeout=60)
    report = await audit(client, settings)
    assert report.dead == []
    assert_exactly_once(report, [f"{s}-1" for s in ("s0", "s1")] + [b["event_id"] for b in later])
    assert report.rejected == []


async def test_a_redis_full_of_finished_entries_trims_them_and_applies_the_backlog_by_itself(
    own_redis: RedisProcess, client: Redis, prefix: str
) -> None:
    # Commands already applied are kept for the replay window (10 min): on a full Redis they
    # would hold back the accepted backlog until it passed. The worker trims what every group
    # has finished with at once, and the backlog is applied with nobody raising maxmemory.
    settings = Settings(redis_url=own_redis.url, stream_prefix=prefix, shards=1)
    await ensure_groups(client, settings)
    async with running_worker(settings):
        bulky = {"notes": "x" * 2_000}
        finished = [dict(session_command(f"s{n}", 1), initial_state=bulky) for n in range(300)]
        await publish_many(client, settings, finished)
        await wait_until(lambda: _results_at_least(client, settings, len(finished)), timeout=60)
        trimmed_before = TRIMMED_WHILE_FULL._value.get()
        lifecycle = StreamKeys(prefix, 0).lifecycle

        backlog = [session_command(f"b{n}", 1) for n in range(300)]
        await publish_then_fill(client, settings, backlog)
        cap = await _maxmemory(client)

        async def all_applied() -> bool:
            return len((await audit(client, settings)).results) >= len(finished) + len(backlog)

        await wait_until(all_applied, timeout=120)
    assert await _maxmemory(client) == cap  # nobody raised it
    assert TRIMMED_WHILE_FULL._value.get() - trimmed_before >= len(finished) // 2
    assert await client.xlen(lifecycle) <= len(backlog)  # the finished commands are gone
    report = await audit(client, settings)
    assert_exactly_once(report, [b["event_id"] for b in finished + backlog])
    assert report.dead == []


async def test_a_terminate_reaching_a_full_redis_leaves_the_session_whole_until_memory_frees(
    own_redis: RedisProcess, client: Redis, prefix: str
) -> None:
    # Terminate deletes before it writes its result: a script without the `#!lua` shebang
    # would pass Redis's OOM check with that first write and then grow a full Redis.
    settings = Settings(redis_url=own_redis.url, stream_prefix=prefix)
    await ensure_groups(client, settings)
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await wait_until(lambda: _true(worker.ready), timeout=30)
    await publish_many(client, settings, [session_command("s0", seq) for seq in (1, 2, 3)])
    await wait_until(lambda: _results_at_least(client, settings, 3), timeout=30)
    keys = SessionKeys.for_session(prefix, settings.shards, "proj", "s0")
    full_before = seen("full")

    await publish_then_fill(client, settings, [session_command("s0", 4)])

    async def held_a_while() -> bool:
        assert not task.done(), "the worker must not exit"
        return seen("full") - full_before >= 3

    await wait_until(held_a_while, timeout=60)
    assert await client.hget(keys.meta, "state") == b"active"  # type: ignore[misc]
    assert await client.exists(keys.vars) == 1
    assert len((await audit(client, settings)).results) == 3

    await uncap(client)
    await wait_until(lambda: _results_at_least(client, settings, 4), timeout=60)
    stop.set()
    await asyncio.wait_for(task, 30)
    assert await client.hget(keys.meta, "state") == b"terminated"  # type: ignore[misc]
    assert (await audit(client, settings)).dead == []


async def test_a_backlog_held_by_a_busy_redis_is_applied_exactly_once_after_the_script_ends(
    own_redis: RedisProcess, client: Redis, prefix: str
) -> None:
    settings = Settings(
        redis_url=own_redis.url, stream_prefix=prefix, max_deliveries=1, batch_size=50
    )
    await client.config_set("busy-reply-threshold", "50")
    await ensure_groups(client, settings)
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await wait_until(lambda: _true(worker.ready), timeout=30)
    busy_before = seen("busy")

    bodies = [session_command(f"s{n}", 1) for n in range(10_000)]
    await publish_many(client, settings, bodies)
    blocker = Redis.from_url(own_redis.url)
    busy_loop = (
        "local t = redis.call('TIME') "
        "while true do local n = redis.call('TIME') "
        "if (n[1] - t[1]) * 1000000 + (n[2] - t[2]) > tonumber(ARGV[1]) then break end end "
        "return 1"
    )
    try:
        await wait_until(lambda: _results_at_least(client, settings, 50), timeout=60)
        await blocker.eval(busy_loop, 0, 2_000_000)  # type: ignore[misc]  # 2 s of BUSY for everyone else
    finally:
        await blocker.aclose()

    async def all_applied() -> bool:
        assert not task.done(), "the worker must not exit"
        return len((await audit(client, settings)).results) >= len(bodies)

    await wait_until(all_applied, timeout=120)
    stop.set()
    await asyncio.wait_for(task, 30)

    assert seen("busy") > busy_before, "the backlog was meant to meet BUSY"
    report = await audit(client, settings)
    assert_exactly_once(report, [b["event_id"] for b in bodies])
    assert report.dead == []
    assert await pending(client, settings) == 0


async def test_results_are_acked_and_trimmed_while_redis_refuses_announcements_then_announced_once(
    own_redis: RedisProcess, client: Redis, prefix: str, database_url: str
) -> None:
    """No operator action: the cap is never lifted. Acknowledged results are trimmed (by
    retention's ``trim_stream``), memory frees below the cap, and the relay announces."""
    settings = Settings(
        redis_url=own_redis.url,
        database_url=database_url,
        stream_prefix=prefix,
        shards=2,
        consolidation_max_attempts=1,  # one counted failure would dead-letter
    )
    results = [terminated("proj-a", f"s-{i}", i) for i in range(400)]
    async with migrated_engine(database_url) as engine:
        consolidator = Consolidator(
            settings,
            client,
            engine,
            block_ms=50,
            backoff_initial_s=0.01,
            backoff_max_s=0.1,
            relay_grace_s=0.2,
            relay_retry_s=0.05,
        )
        await consolidator.ensure_groups()
        empty = await _used_memory(client)
        await publish_results(client, settings, results)
        backlog = await _used_memory(client)
        cap = empty + (backlog - empty) // 2  # full now; not once the backlog is trimmed
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", str(cap))
        full_before = seen("full")
        stop = asyncio.Event()
        task = asyncio.create_task(consolidator.run(stop))

        async def all_acknowledged() -> bool:
            assert not task.done(), "the consolidator must not exit"
            async with engine.connect() as conn:
                stored = (await conn.execute(select(func.count()).select_from(Episode))).scalar()
            return stored == 400 and await _consolidation_pending(client, settings) == 0

        await wait_until(all_acknowledged, timeout=120)
        assert int(await client.xlen(episodes_stream(prefix))) == 0  # XADD refused: full
        assert await _dead_letters(client, settings) == 0
        assert consolidator.is_ready()  # it consumes: a refused announcement is no outage
        assert seen("full") == full_before
        async with engine.connect() as conn:
            row = await conn.execute(
                select(func.count(), func.count(Episode.announced_at)).select_from(Episode)
            )
            assert tuple(row.one()) == (400, 0)

        for shard in range(settings.shards):  # what the worker's retention loop does
            await trim_stream(client, StreamKeys(prefix, shard).results, 0.0)
        assert not await _results_at_least(client, settings, 1)
        assert await _used_memory(client) < cap  # memory freed, cap unchanged

        async def all_announced() -> bool:
            assert not task.done(), "the consolidator must not exit"
            return int(await client.xlen(episodes_stream(prefix))) >= 400

        await wait_until(all_announced, timeout=120)
        stop.set()
        await asyncio.wait_for(task, 30)
        config: Any = await client.config_get("maxmemory")
        assert int(config["maxmemory"]) == cap  # never lifted

        async with engine.connect() as conn:
            row = await conn.execute(
                select(func.count(), func.count(Episode.announced_at)).select_from(Episode)
            )
            assert tuple(row.one()) == (400, 400)
    events: Any = await client.xrange(episodes_stream(prefix))
    announced = [orjson.loads(f[b"data"])["causation_id"] for _i, f in events]
    assert sorted(announced) == sorted(r["event_id"] for r in results)  # each exactly once
    assert await _dead_letters(client, settings) == 0


async def _used_memory(redis: Redis) -> int:
    return int((await redis.info("memory"))["used_memory"])


async def test_an_orchestrator_publishing_to_a_full_redis_gets_one_clear_error(
    own_redis: RedisProcess, client: Redis, prefix: str
) -> None:
    settings = Settings(redis_url=own_redis.url, stream_prefix=prefix)
    await client.xadd(StreamKeys(prefix, 0).lifecycle, {"data": b"{}"})
    await make_full(client)

    lifecycle = LifecycleClient(client, settings)
    refused, line = await _every_publisher_refused(client, settings, "Redis is full: ")
    assert refused.condition.kind == "full"
    assert "reached maxmemory" in str(refused) and "docs/guides/capacity.md" in str(refused)
    assert line.startswith("memworker: error: Redis is full: used_memory")
    assert "raise maxmemory" in line

    await uncap(client)  # and then it is accepted
    assert await lifecycle.spawn("p1", "s1", "agent-1", {"goal": "x"})


async def test_publishes_are_refused_clearly_before_redis_is_full_so_accepted_commands_apply(
    own_redis: RedisProcess, client: Redis, prefix: str
) -> None:
    # Past maxmemory less MEMWORKER_ADMISSION_RESERVE the worker closes admission: publishes
    # through LifecycleClient and memworker publish are refused with the figures, nothing is
    # written, and the reserve stays for applying what was accepted. It reopens by itself.
    settings = Settings(redis_url=own_redis.url, stream_prefix=prefix, admission_interval_ms=50)
    await ensure_groups(client, settings)
    async with running_worker(settings) as worker:
        lifecycle = LifecycleClient(client, settings)
        assert await lifecycle.spawn("p1", "s1", "agent-1", {"goal": "x"})
        used = await _settled_used_memory(client)
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", str(used * 21 // 20))  # used is 95 % of the cap
        stream = StreamKeys(prefix, shard_of("p1", "s2", settings.shards)).lifecycle
        await wait_until(lambda: _true(worker.admission.closed), timeout=30)
        length = await client.xlen(stream)

        refused, _line = await _every_publisher_refused(client, settings, "Redis is nearly full: ")
        assert refused.condition.kind == "nearly_full"
        message = str(refused)
        assert "MEMWORKER_ADMISSION_RESERVE 10%" in message and "raise maxmemory" in message
        assert await client.xlen(stream) == length  # nothing was written

        # An orchestrator's own XADD (Redis takes it: under maxmemory) is applied from the reserve,
        # and under this pressure its entry is deleted with its acknowledgement.
        body = session_command("s9", 1)
        own = StreamKeys(prefix, shard_of(body["project_id"], "s9", settings.shards)).lifecycle
        raw = await client.xadd(own, {"data": orjson.dumps(body)})
        await wait_until(lambda: _results_at_least(client, settings, 2), timeout=30)
        assert await client.xrange(own, raw, raw) == []

        await uncap(client)
        await wait_until(lambda: _true(not worker.admission.closed), timeout=30)
        assert await lifecycle.spawn("p1", "s2", "agent-1", {"goal": "x"})
        await wait_until(lambda: _results_at_least(client, settings, 3), timeout=30)
        kept = await client.xadd(own, {"data": orjson.dumps(session_command("s10", 1))})
        await wait_until(lambda: _results_at_least(client, settings, 4), timeout=30)
        rows: Any = await client.xrange(own, kept, kept)
        assert len(rows) == 1  # kept for replay again


async def test_the_worker_checks_memory_more_often_near_the_admission_limit(
    own_redis: RedisProcess, client: Redis, prefix: str
) -> None:
    # A burst of publishes between two admission checks eats the reserve; near the limit the
    # worker checks every MEMWORKER_ADMISSION_INTERVAL_NEAR_FULL_MS instead, and back at its
    # own pace once there is room again. Counted by the server (INFO commandstats), compared
    # within this run: the worker's checks are its only INFO calls at this pace.
    settings = Settings(
        redis_url=own_redis.url,
        stream_prefix=prefix,
        admission_interval_ms=250,
        admission_interval_near_full_ms=10,
    )
    await ensure_groups(client, settings)

    async def checks_in(seconds: float) -> int:
        before = await _info_calls(client)
        await asyncio.sleep(seconds)
        return await _info_calls(client) - before - 1  # less the test's first reading

    async with running_worker(settings) as worker:
        roomy = await checks_in(2.0)
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", str(used * 100 // 85))  # used is 85 % of the cap
        await wait_until(lambda: _true(bool(worker.admission.near_full_servers)), timeout=30)
        near = await checks_in(2.0)
        assert not worker.admission.closed  # under the limit (90 %): publishes still accepted
        assert await LifecycleClient(client, settings).spawn("p1", "s1", "agent-1", {"k": 1})
        await uncap(client)
        await wait_until(lambda: _true(not worker.admission.near_full_servers), timeout=30)
        again = await checks_in(2.0)
    assert near >= 4 * max(roomy, again), (roomy, near, again)
    assert roomy >= 1 and again >= 1


async def _info_calls(client: Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_info", {}).get("calls", 0))


async def _settled_used_memory(client: Redis) -> int:
    """``used_memory`` once the worker is idle: the most of a few readings over half a second.
    One reading taken just after a command can be ~150 KB under what the same idle server uses
    0.2 s later (client buffers come and go as the worker's reads block and wake)."""
    readings = []
    for _ in range(5):
        readings.append(int((await client.info("memory"))["used_memory"]))
        await asyncio.sleep(0.1)
    return max(readings)


async def _every_publisher_refused(
    client: Redis, settings: Settings, text: str
) -> tuple[RedisConditionError, str]:
    """``LifecycleClient`` (assigning the seq, and with a seq of its own) and ``memworker
    publish`` are each refused with one line starting with ``text``; returns the client's
    error and the CLI's line."""
    lifecycle = LifecycleClient(client, settings)
    with pytest.raises(RedisConditionError, match=text) as raised:
        await lifecycle.spawn("p1", "s2", "agent-1", {"goal": "x"})
    with pytest.raises(RedisConditionError, match=text):
        await lifecycle.publish(
            {"type": "spawn", "project_id": "p1", "session_id": "s3", "agent_instance_id": "a"},
            assign_seq=False,
        )
    cli = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "worker.cli", "publish", "spawn", "-p", "p1", "-s", "s4"],
        env=worker_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 1
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1, cli.stderr
    assert lines[0].startswith(f"memworker: error: {text}"), lines
    return raised.value, lines[0]


async def _results_at_least(redis: Redis, settings: Settings, n: int) -> bool:
    total = 0
    for shard in range(settings.shards):
        total += int(await redis.xlen(StreamKeys(settings.stream_prefix, shard).results))
    return total >= n


async def _dead_letters(redis: Redis, settings: Settings) -> int:
    total = 0
    for shard in range(settings.shards):
        total += int(await redis.xlen(StreamKeys(settings.stream_prefix, shard).dlq))
    return total


async def _consolidation_pending(redis: Redis, settings: Settings) -> int:
    total = 0
    for shard in range(settings.shards):
        stream = StreamKeys(settings.stream_prefix, shard).results
        total += int((await redis.xpending(stream, CONSOLIDATION_GROUP))["pending"])
    return total


async def _true(value: bool) -> bool:
    return value


async def test_working_memory_on_a_full_redis_raises_one_error_naming_the_condition(
    own_redis: RedisProcess, client: Redis, prefix: str
) -> None:
    settings = Settings(redis_url=own_redis.url, stream_prefix=prefix)
    memory = await WorkingMemory.for_session("s1", project_id="p1", redis=client, settings=settings)
    await memory.set("before", {"n": 1})
    await make_full(client)

    with pytest.raises(RedisUnavailableError) as raised:
        await memory.set("goal", "x" * 10_000)

    assert raised.value.condition.kind == "full"
    message = str(raised.value)
    assert message.startswith("Redis is full: used_memory ")
    assert "reached maxmemory" in message and "raise maxmemory" in message
    assert "\n" not in message
    assert await memory.get("before") == {"n": 1}  # reads still work
    await uncap(client)
    await memory.set("goal", "x")
    assert await memory.get("goal") == "x"


async def test_an_offered_load_above_what_fits_is_refused_clearly_and_nothing_accepted_is_lost(
    own_redis: RedisProcess, client: Redis, prefix: str, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    used = int((await client.info("memory"))["used_memory"])
    # 3,000 sessions of 8 KB (24 MB offered) into 16 MB: about 1.6 MB of it is the reserve.
    report = await run_full_redis(
        own_redis.url, database_url, prefix, maxmemory=used + 16 * 2**20, sessions=3_000
    )
    figures("full_redis", **report.summary())

    # refused by the worker's admission (past maxmemory less the reserve) or by Redis itself
    refused = report.refused["nearly_full"] + report.refused["full"]
    assert refused > 0, "the offered load was meant not to fit"
    assert report.refusal.startswith(("Redis is nearly full: used_memory ", "Redis is full: "))
    assert "maxmemory" in report.refusal
    assert not report.worker_exited and not report.consolidator_exited
    assert len(report.accepted) == 6_000
    assert report.missing == [] and report.duplicated == 0  # every accepted command, once
    assert report.dead_letters == 0
    # Nobody freed memory or raised the cap: admission kept the reserve for the applies, and
    # data (memory as Redis counts it, less clients' buffers) never passed the cap.
    assert report.raises == 0, report.stalls
    assert report.peak_data_over_cap <= 0, report.at_peak
