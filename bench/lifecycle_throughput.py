"""Commands/s of one lifecycle worker process on a prefilled stream, next to a plain
FastStream per-message subscriber doing the same work (same parse, same apply script) the
plain way: one awaited EVALSHA per message through redis-py's client; in the same run.

    .venv/bin/python bench/lifecycle_throughput.py [--redis-url URL] [--sessions 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time
import uuid
from typing import Any

import orjson
from baselines import plain_subscriber
from faststream.redis import RedisBroker
from redis.asyncio import Redis

from worker.consumers.groups import ensure_group
from worker.keys import LIFECYCLE_GROUP, StreamKeys
from worker.lifecycle.apply import CommandApplier
from worker.lifecycle.worker import LifecycleWorker
from worker.logs import configure_logging
from worker.settings import Settings

KINDS = ["spawn", "pause", "resume", "terminate"]


async def prefill(redis: Redis, settings: Settings, sessions: int) -> int:
    streams = StreamKeys(settings.stream_prefix, 0)
    await ensure_group(redis, streams.lifecycle, LIFECYCLE_GROUP)
    pipe = redis.pipeline(transaction=False)
    total = 0
    for seq, kind in enumerate(KINDS, start=1):
        for n in range(sessions):
            body: dict[str, Any] = {
                "type": kind,
                "event_id": f"s{n}-{seq}",
                "project_id": "bench",
                "session_id": f"s{n}",
                "agent_instance_id": "a",
                "seq": seq,
            }
            if kind == "spawn":
                body["initial_state"] = {f"k{i}": {"v": i, "note": "x" * 20} for i in range(10)}
            pipe.xadd(streams.lifecycle, {"data": orjson.dumps(body)})
            total += 1
            if len(pipe) >= 2000:
                await pipe.execute()
    await pipe.execute()
    return total


async def wait_for(redis: Redis, stream: str, n: int) -> None:
    while int(await redis.xlen(stream)) < n:
        await asyncio.sleep(0.01)


async def cleanup(redis: Redis, prefix: str) -> None:
    keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=5000)]
    for i in range(0, len(keys), 5000):
        await redis.unlink(*keys[i : i + 5000])


async def batched(redis: Redis, settings: Settings, total: int) -> float:
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(worker.run(stop))
    await wait_for(redis, StreamKeys(settings.stream_prefix, 0).results, total)
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    return total / elapsed


async def per_message(redis: Redis, settings: Settings, total: int) -> float:
    """The plain way: FastStream's per-message stream subscriber, one apply per message."""
    streams = StreamKeys(settings.stream_prefix, 0)
    broker = RedisBroker(settings.redis_url, logger=None)  # type: ignore[arg-type]
    applier = CommandApplier(redis, settings)
    await applier.ensure_scripts()

    plain_subscriber(broker, redis, applier, streams.lifecycle)

    started = time.perf_counter()
    await broker.start()
    await wait_for(redis, streams.results, total)
    elapsed = time.perf_counter() - started
    await broker.stop()
    return total / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--sessions", type=int, default=5000)
    args = parser.parse_args()
    configure_logging("WARNING")
    redis = Redis.from_url(args.redis_url)
    figures: dict[str, float] = {}
    for name, runner in (("batched", batched), ("per_message", per_message)):
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        settings = Settings(redis_url=args.redis_url, stream_prefix=prefix)
        try:
            total = await prefill(redis, settings, args.sessions)
            figures[name] = await runner(redis, settings, total)
        finally:
            await cleanup(redis, prefix)
    await redis.aclose()
    ratio = figures["batched"] / figures["per_message"]
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, sessions={args.sessions} "
        f"({args.sessions * 4} commands, spawn with 10 keys)"
    )
    print("| implementation | commands/s | ratio |")
    print("|---|---:|---:|")
    print(
        f"| memworker worker (batched Lua pipeline, 1 process) | {figures['batched']:,.0f} "
        f"| {ratio:.1f}x |"
    )
    print(
        f"| plain FastStream per-message subscriber, same script | "
        f"{figures['per_message']:,.0f} | 1.0x |"
    )


if __name__ == "__main__":
    asyncio.run(main())
