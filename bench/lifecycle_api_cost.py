"""What the seed-shaped lifecycle API costs per call: AgentLifecycleManager and LifecycleHooks.

    .venv/bin/python bench/lifecycle_api_cost.py --redis-url redis://127.0.0.1:PORT/0 [--calls 600]

Run it against a Redis nothing else uses (its figures are ``INFO commandstats`` differences, so
other clients' commands would count too; it never resets or configures the server). It starts
a ``memworker run`` subprocess, makes ``--calls`` manager calls one after another (spawn then
terminate of fresh sessions), then serves ``LifecycleHooks`` over as many preloaded results.
Prints, per manager call and per hooked result, the Redis commands and Redis CPU, and the
client's CPU. Everything lives under a unique key prefix, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from harness import cleanup, memworker_command, service_env, services, unique_prefix
from redis.asyncio import Redis

from worker.keys import StreamKeys
from worker.settings import Settings

Stats = dict[str, tuple[int, int]]


async def commandstats(redis: Redis) -> Stats:
    info: dict[str, Any] = await redis.info("commandstats")
    return {name: (int(v["calls"]), int(v["usec"])) for name, v in info.items()}


def per_unit(before: Stats, after: Stats, units: int) -> list[str]:
    lines = []
    for name, (calls, usec) in sorted(after.items()):
        calls0, usec0 = before.get(name, (0, 0))
        if calls > calls0 and not name.startswith("cmdstat_info"):
            lines.append(
                f"  {name.removeprefix('cmdstat_')}: {(calls - calls0) / units:.2f} calls, "
                f"{(usec - usec0) / units:.1f} µs Redis CPU"
            )
    return lines


async def manager_calls(redis: Redis, settings: Settings, calls: int) -> None:
    from worker import AgentLifecycleManager

    async with AgentLifecycleManager(settings=settings) as manager:
        await manager.spawn("bench", "agent", "warm-up")
        before, cpu, wall = await commandstats(redis), time.process_time(), time.perf_counter()
        for n in range(calls // 2):
            await manager.spawn("bench", "agent", f"s{n}", initial_state={"n": n})
            await manager.terminate("bench", "agent", f"s{n}")
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = await commandstats(redis)
    print(f"AgentLifecycleManager, {calls} calls one after another (spawn, terminate):")
    print(f"  client CPU {cpu / calls * 1e6:.0f} µs/call, {wall / calls * 1e3:.2f} ms/call")
    print("  per call, the worker's commands included:")
    print("\n".join(per_unit(before, after, calls)))


async def hooked_results(redis: Redis, settings: Settings, results: int) -> None:
    from worker import LifecycleEvent, LifecycleHooks

    stream = StreamKeys(settings.stream_prefix, 0).results
    seen = 0
    hooks = LifecycleHooks()

    @hooks.on_spawn
    def count(event: LifecycleEvent) -> None:
        nonlocal seen
        seen += 1

    stop, ready = asyncio.Event(), asyncio.Event()
    serving = asyncio.create_task(hooks.serve("bench-hooks", stop=stop, ready=ready))
    await ready.wait()
    body = (
        '{"event_id":"r-%d","type":"agent.spawned","causation_id":"c-%d","command":"spawn",'
        '"project_id":"bench","session_id":"h%d","agent_instance_id":"agent",'
        '"occurred_at":"2026-01-01T00:00:00Z","duration_ms":0.1,"initial_items":1}'
    )
    before, cpu = await commandstats(redis), time.process_time()
    pipe = redis.pipeline(transaction=False)
    for n in range(results):
        pipe.xadd(stream, {"data": body % (n, n, n)})
    await pipe.execute()
    while seen < results:
        await asyncio.sleep(0.01)
    cpu = time.process_time() - cpu
    after = await commandstats(redis)
    stop.set()
    await serving
    print(f"LifecycleHooks.serve, {results} results (XADDed by this process meanwhile):")
    print(f"  client CPU {cpu / results * 1e6:.0f} µs/result, the XADD pipeline included")
    print("  per result, the XADDs included:")
    print("\n".join(per_unit(before, after, results)))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", required=True, help="a Redis nothing else uses")
    parser.add_argument("--calls", type=int, default=600)
    args = parser.parse_args()
    prefix = unique_prefix("lifecycle-api")
    settings = Settings(redis_url=args.redis_url, stream_prefix=prefix)
    os.environ.update(REDIS_URL=args.redis_url, MEMWORKER_STREAM_PREFIX=prefix)
    redis = Redis.from_url(args.redis_url)
    try:
        with services([memworker_command("run")], service_env(args.redis_url, prefix)):
            await manager_calls(redis, settings, args.calls)
        await hooked_results(redis, settings, args.calls * 5)
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
