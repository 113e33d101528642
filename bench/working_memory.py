"""WorkingMemory against raw redis-py, in one run on one server.

    .venv/bin/python bench/working_memory.py [--redis-url URL] [--ops 10000] [--keys 1000]

Measures get and set latency (p50/p99 over ``--ops`` sequential awaits each) next to plain
redis-py GET/SET on the same kind of client, and a checkpoint of a ``--keys``-key session via
``create_checkpoint`` (one server-side script) next to a naive copy that does one round trip per
key. Everything lives under a unique key prefix, deleted at the end. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

import orjson
from redis.asyncio import Redis

from worker.memory import WorkingMemory
from worker.memory.redis_backend import RedisBackend
from worker.settings import DEFAULT_REDIS_URL, Settings

WARMUP = 200


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def interleaved(
    ours: Callable[[int], Awaitable[object]], raw: Callable[[int], Awaitable[object]], count: int
) -> tuple[list[float], list[float]]:
    """Microseconds of ``count`` awaits of each, alternating, so that noise from other
    processes on the machine hits both sides alike."""
    for i in range(min(WARMUP, count)):
        await ours(i)
        await raw(i)
    ours_us, raw_us = [], []
    clock = time.perf_counter_ns
    for i in range(count):
        start = clock()
        await ours(i)
        middle = clock()
        await raw(i)
        end = clock()
        ours_us.append((middle - start) / 1000)
        raw_us.append((end - middle) / 1000)
    return ours_us, raw_us


async def timed(op: Callable[[int], Awaitable[object]], count: int) -> list[float]:
    """Microseconds of each of ``count`` sequential awaits of ``op(i)``."""
    for i in range(min(WARMUP, count)):
        await op(i)
    samples = []
    clock = time.perf_counter_ns
    for i in range(count):
        start = clock()
        await op(i)
        samples.append((clock() - start) / 1000)
    return samples


async def naive_checkpoint(redis: Redis, source: str, target: str) -> None:
    """What a client without server-side scripts does: one HGET and one HSET per key."""
    names = await redis.hkeys(source)  # type: ignore[misc]
    values = {}
    for name in names:
        values[name] = await redis.hget(source, name)  # type: ignore[misc]
    for name, value in values.items():
        await redis.hset(target, name, value)  # type: ignore[misc]


async def cleanup(redis: Redis, prefix: str) -> None:
    async for key in redis.scan_iter(match=f"{prefix}:*", count=1000):
        await redis.unlink(key)


async def run(url: str, ops: int, keys: int, reps: int) -> str:
    prefix = "bench" + uuid.uuid4().hex[:12]
    settings = Settings(
        redis_url=url, stream_prefix=prefix, max_checkpoints_per_session=reps + WARMUP
    )
    redis = Redis.from_url(url)
    memory = await WorkingMemory.for_session("bench", project_id="bench", settings=settings)
    value = {"step": 7, "note": "x" * 32, "tags": ["a", "b"]}
    payload = orjson.dumps(value)
    try:
        wm_set, raw_set = await interleaved(
            lambda i: memory.set(f"k{i % 100}", value),
            lambda i: redis.set(f"{prefix}:raw:{i % 100}", payload),
            ops,
        )
        wm_get, raw_get = await interleaved(
            lambda i: memory.get(f"k{i % 100}"),
            lambda i: redis.get(f"{prefix}:raw:{i % 100}"),
            ops,
        )

        # Redis CPU of one set (its script's EVALSHA), as the server counts it: what a change
        # to wm_set.lua costs every call, free of the round trip's noise.
        await redis.config_resetstat()
        for i in range(ops):
            await memory.set(f"k{i % 100}", value)
        stats = (await redis.info("commandstats"))["cmdstat_evalsha"]
        set_cpu_us = float(stats["usec_per_call"])

        await memory.clear()
        for i in range(keys):
            await memory.set(f"key-{i}", {"i": i, "note": "x" * 32})
        assert isinstance(memory.backend, RedisBackend)
        source = memory.backend.keys.vars
        created = await timed(lambda i: memory.create_checkpoint(checkpoint_id=f"cp-{i}"), reps)
        restored = await timed(lambda i: memory.restore_checkpoint("cp-0"), reps)
        naive_reps = max(3, reps // 4)
        naive = await timed(
            lambda i: naive_checkpoint(redis, source, f"{prefix}:naive:{i}"), naive_reps
        )
    finally:
        await cleanup(redis, prefix)
        await memory.close()
        await redis.aclose()

    def us(x: float) -> str:
        return f"{x:,.0f} µs"

    def ms(x: float) -> str:
        return f"{x / 1000:,.2f} ms"

    lines = [
        f"Redis {url} · Python {platform.python_version()} · {os.cpu_count()} CPUs · "
        f"{ops:,} sequential awaits per cell, raw and ours alternating",
        "",
        "| operation | WorkingMemory p50 | WorkingMemory p99 | raw redis-py p50 | "
        "raw redis-py p99 | ratio p50 | ratio p99 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, ours, raw in (("set", wm_set, raw_set), ("get", wm_get, raw_get)):
        o50, o99, r50, r99 = (
            percentile(ours, 50),
            percentile(ours, 99),
            percentile(raw, 50),
            percentile(raw, 99),
        )
        lines.append(
            f"| {name} | {us(o50)} | {us(o99)} | {us(r50)} | {us(r99)} | "
            f"{o50 / r50:.2f}× | {o99 / r99:.2f}× |"
        )
    c50, n50 = statistics.median(created), statistics.median(naive)
    lines += [
        "",
        f"Redis CPU per set (INFO commandstats, EVALSHA usec_per_call over {ops:,} sets of "
        f"100 keys): **{set_cpu_us:.2f} µs**",
        "",
        f"| {keys:,}-key session | median | max | speed-up vs per-key |",
        "|---|---:|---:|---:|",
        f"| `create_checkpoint` (one script, {reps} runs) | {ms(c50)} | {ms(max(created))} "
        f"| {n50 / c50:,.0f}× |",
        f"| `restore_checkpoint` (one script, {reps} runs) | {ms(statistics.median(restored))} "
        f"| {ms(max(restored))} | |",
        f"| naive copy: HGET + HSET per key ({naive_reps} runs) | {ms(n50)} | {ms(max(naive))} "
        "| 1× |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--checkpoint-runs", type=int, default=20)
    args = parser.parse_args()
    print(asyncio.run(run(args.redis_url, args.ops, args.keys, args.checkpoint_runs)))


if __name__ == "__main__":
    main()
