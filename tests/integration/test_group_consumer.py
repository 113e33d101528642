"""The shared consumer-group loop against real Redis, driven by a tiny handler whose "storage"
is a list the test can make fail: pending entries, reclaim, the delivery cap, outages."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from redis.asyncio import Redis

from worker.consumers.loop import (
    BatchOutcome,
    Failure,
    GroupConsumer,
    Rejection,
    StorageUnavailableError,
    StreamEntry,
)

GROUP = "tiny"


class TinyHandler:
    """Stores each entry's ``n`` in a list. ``poison`` values always fail; while
    ``available`` is False the storage is down; ``junk`` entries (no ``n``) are rejected."""

    group = GROUP
    storage_errors: tuple[type[BaseException], ...] = (StorageUnavailableError,)
    failure_reason = "tiny_failed"

    def __init__(self, prefix: str, shards: int = 2, poison: frozenset[int] = frozenset()) -> None:
        self.streams = [f"{prefix}:src:{{{i}}}" for i in range(shards)]
        self.prefix = prefix
        self.poison = poison
        self.available = True
        self.stored: list[int] = []
        self.refused = 0  # calls met while the storage was down

    def dlq_stream(self, stream: str) -> str:
        return stream.replace(":src:", ":dlq:")

    async def prepare(self, entries: Sequence[StreamEntry]) -> list[tuple[StreamEntry, Any]]:
        return [(entry, orjson.loads(entry.fields["data"])) for entry in entries]

    async def finish(self, batch: list[tuple[StreamEntry, Any]]) -> BatchOutcome:
        self._refuse_while_down()
        outcome = BatchOutcome()
        for entry, body in batch:
            if "n" not in body:
                outcome.rejected.append(Rejection(entry, "junk", "no 'n' in the body"))
            elif body["n"] in self.poison:
                outcome.failed.append(Failure(entry, f"cannot store {body['n']}", {"n": body["n"]}))
            else:
                self.stored.append(body["n"])
                outcome.done.append(entry)
        return outcome

    async def check_storage(self) -> None:
        self._refuse_while_down()

    def _refuse_while_down(self) -> None:
        if not self.available:
            self.refused += 1
            raise StorageUnavailableError("the tiny store is down")


def consumer_of(redis: Redis, handler: TinyHandler, **kw: Any) -> GroupConsumer[Any]:
    kw.setdefault("backoff_initial_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    kw.setdefault("block_ms", 50)
    kw.setdefault("batch_size", 10)
    return GroupConsumer(redis, handler, **kw)


async def publish(redis: Redis, handler: TinyHandler, numbers: range | list[int]) -> None:
    for n in numbers:
        stream = handler.streams[n % len(handler.streams)]
        await redis.xadd(stream, {"data": orjson.dumps({"n": n})})


async def pending(redis: Redis, handler: TinyHandler) -> int:
    total = 0
    for stream in handler.streams:
        total += int((await redis.xpending(stream, GROUP))["pending"])
    return total


async def dead_letters(redis: Redis, handler: TinyHandler) -> list[dict[str, str]]:
    letters = []
    for stream in handler.streams:
        rows: Any = await redis.xrange(handler.dlq_stream(stream))
        letters += [{k.decode(): v.decode() for k, v in f.items()} for _i, f in rows]
    return letters


async def wait_until(condition: Callable[[], Awaitable[bool]], seconds: float = 30) -> None:
    async with asyncio.timeout(seconds):
        while not await condition():
            await asyncio.sleep(0.02)


async def test_every_entry_of_every_stream_is_handled_once_and_acknowledged(
    redis: Redis, prefix: str
) -> None:
    handler = TinyHandler(prefix, shards=3)
    await consumer_of(redis, handler).ensure_groups()
    await publish(redis, handler, range(95))

    finished = await consumer_of(redis, handler).run_once()

    assert finished == 95
    assert sorted(handler.stored) == list(range(95))
    assert await pending(redis, handler) == 0


async def test_a_restarted_consumer_drains_its_own_pending_entries_first(
    redis: Redis, prefix: str
) -> None:
    handler = TinyHandler(prefix)
    await consumer_of(redis, handler).ensure_groups()
    await publish(redis, handler, range(6))
    for stream in handler.streams:  # read by "replica-1", which then crashed
        await redis.xreadgroup(GROUP, "replica-1", {stream: ">"}, count=10)
    await publish(redis, handler, range(6, 8))

    restarted = consumer_of(redis, handler, consumer="replica-1")  # idle time not reached
    first = await restarted.process_next_batch(block_ms=None)

    assert first is not None
    assert sorted(handler.stored) == list(range(6))  # its own pending, before anything new
    assert await restarted.run_once() == 2
    assert sorted(handler.stored) == list(range(8))
    assert await pending(redis, handler) == 0


async def test_entries_a_dead_consumer_left_pending_are_reclaimed(
    redis: Redis, prefix: str
) -> None:
    handler = TinyHandler(prefix)
    await consumer_of(redis, handler).ensure_groups()
    await publish(redis, handler, range(25))
    for stream in handler.streams:
        await redis.xreadgroup(GROUP, "died-mid-batch", {stream: ">"}, count=100)
    assert await pending(redis, handler) == 25

    survivor = consumer_of(redis, handler, reclaim_idle_ms=0, batch_size=4)  # cursor walks on
    await survivor.run_once()

    assert sorted(handler.stored) == list(range(25))
    assert await pending(redis, handler) == 0
    consumers: Any = await redis.xinfo_consumers(handler.streams[0], GROUP)
    by_name = {c["name"].decode(): c["pending"] for c in consumers}
    assert by_name["died-mid-batch"] == 0


async def test_an_entry_that_keeps_failing_is_dead_lettered_after_the_cap_and_the_rest_land(
    redis: Redis, prefix: str
) -> None:
    handler = TinyHandler(prefix, poison=frozenset({7}))
    await publish(redis, handler, range(20))
    junk = await redis.xadd(handler.streams[0], {"data": b"{}"})

    finished = await consumer_of(redis, handler, max_attempts=3).run_once()

    assert finished == 21
    assert sorted(handler.stored) == [n for n in range(20) if n != 7]
    letters = await dead_letters(redis, handler)
    by_reason = {letter["reason"]: letter for letter in letters}
    assert sorted(by_reason) == ["junk", "tiny_failed"]
    poisoned = by_reason["tiny_failed"]
    assert (poisoned["error"], poisoned["deliveries"], poisoned["group"]) == (
        "cannot store 7",
        "3",
        GROUP,
    )
    assert poisoned["source_stream"] == handler.streams[1]
    assert orjson.loads(orjson.loads(poisoned["data"])["data"]) == {"n": 7}
    assert by_reason["junk"]["source_id"] == (junk.decode() if isinstance(junk, bytes) else junk)
    assert by_reason["junk"]["deliveries"] == "1"
    assert await pending(redis, handler) == 0


async def test_a_storage_outage_dead_letters_nothing_reports_not_ready_then_resumes(
    redis: Redis, prefix: str
) -> None:
    handler = TinyHandler(prefix)
    consumer = consumer_of(redis, handler, max_attempts=2)  # an outage must burn no attempt
    await publish(redis, handler, range(10))
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))

    async def ready() -> bool:
        return consumer.is_ready()

    await wait_until(lambda: _true(len(handler.stored) == 10))
    await wait_until(ready)

    handler.available = False
    await publish(redis, handler, range(10, 30))
    await wait_until(lambda: _true(handler.refused >= 8))  # many failed tries
    assert not consumer.is_ready()
    assert not task.done(), "an outage must not end the loop"
    assert await dead_letters(redis, handler) == []
    assert await pending(redis, handler) > 0

    handler.available = True
    await wait_until(lambda: _true(len(handler.stored) == 30))
    await wait_until(ready)
    stop.set()
    await asyncio.wait_for(task, 5)

    assert sorted(handler.stored) == list(range(30))  # each exactly once
    assert await dead_letters(redis, handler) == []
    assert await pending(redis, handler) == 0


async def test_a_consumer_whose_storage_cannot_be_used_is_not_ready_while_nothing_flows(
    redis: Redis, prefix: str
) -> None:
    handler = TinyHandler(prefix)
    handler.available = False
    consumer = consumer_of(redis, handler)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await wait_until(lambda: _true(handler.refused >= 3))
    assert not consumer.is_ready()

    handler.available = True
    await wait_until(lambda: _true(consumer.is_ready()))
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_stop_wakes_the_loop_out_of_a_long_backoff(redis: Redis, prefix: str) -> None:
    handler = TinyHandler(prefix)
    handler.available = False
    consumer = consumer_of(redis, handler, backoff_initial_s=600, backoff_max_s=600)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    await wait_until(lambda: _true(consumer._outages > 0))

    stop.set()
    await asyncio.wait_for(task, 5)  # far less than the 600 s backoff


async def _true(value: bool) -> bool:
    return value


async def test_a_read_whose_reply_a_frozen_process_lost_is_read_again_at_once(
    redis: Redis, redis_url: str, prefix: str
) -> None:
    """A process frozen (SIGSTOP, a long GC pause, a stalled VM) past its client's socket
    timeout loses the reply of the read in flight: Redis delivered the entries (they are this
    consumer's pending ones now) but the client timed out. The next step reads them at once,
    not after another consumer's reclaim idle, and a log line says what happened."""
    import time

    import structlog
    from redis import Redis as SyncRedis
    from redis.exceptions import TimeoutError as RedisTimeoutError

    handler = TinyHandler(prefix, shards=1)
    client = Redis.from_url(redis_url, socket_timeout=0.3)
    publisher = SyncRedis.from_url(redis_url)
    try:
        consumer = consumer_of(client, handler, reclaim_idle_ms=600_000)
        await consumer.ensure_groups()
        assert await consumer.process_next_batch(block_ms=None) is None  # own pending: none
        reading = asyncio.create_task(consumer.process_next_batch(block_ms=2_000))
        await asyncio.sleep(0.1)  # the XREADGROUP ... BLOCK is waiting at the server
        with structlog.testing.capture_logs() as logs:
            publisher.xadd(handler.streams[0], {"data": orjson.dumps({"n": 7})})
            time.sleep(0.6)  # the whole process freezes; Redis's reply waits in the socket
            with contextlib.suppress(RedisTimeoutError):
                await reading
        assert reading.exception() is not None, "the read survived the freeze: nothing tested"
        assert await pending(redis, handler) == 1  # delivered to us, never handled
        assert any("read failed" in line["event"] for line in logs), logs

        outcome = await consumer.process_next_batch(block_ms=None)

        assert outcome is not None and handler.stored == [7]
        assert await pending(redis, handler) == 0
    finally:
        publisher.close()
        await client.aclose()
