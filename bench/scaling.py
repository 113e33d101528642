"""Command throughput with 1, 2 and 4 worker processes, on 1 and 4 shards.

    .venv/bin/python bench/scaling.py [--redis-url URL] [--sessions 10000] \\
        [--processes 1 2 4] [--shards 1 4]

For each (shards, processes): the commands (``--sessions`` × spawn with 10 variables, pause,
resume, terminate, with ``seq``) are written to staging streams that already hold the
``lifecycle`` group; ``MEMWORKER_SHARDS=S memworker run --workers N`` is started on empty
lifecycle streams and waited for until all N processes read every shard; then one
MULTI/EXEC RENAMEs the staging streams over the lifecycle streams, so the whole backlog appears
at once to workers that are already up. Throughput = commands ÷ (id time of the last result −
server time of the RENAME); process start-up is not counted.

Scaling efficiency = throughput(N) ÷ (N × throughput(1 process, same shards)); the ratio column
is against 1 process on 1 shard.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from typing import Any

import orjson
from harness import (
    DEFAULT_REDIS_URL,
    KINDS,
    cancel_on_sigterm,
    cleanup,
    command,
    ensure_group,
    invocation,
    markdown_table,
    memworker_command,
    service_env,
    services,
    stream_ms,
    unique_prefix,
    wait_for_consumers,
)
from redis.asyncio import Redis

from worker.keys import LIFECYCLE_GROUP, StreamKeys, shard_of

DRAIN_TIMEOUT_SECONDS = 300.0


def staging(prefix: str, shard: int) -> str:
    return f"{prefix}:staging:{{{shard}}}"


async def prefill(redis: Redis, prefix: str, shards: int, sessions: int) -> int:
    """All spawns, then all pauses, … so that one session's commands are far apart."""
    for shard in range(shards):
        await ensure_group(redis, staging(prefix, shard), LIFECYCLE_GROUP)
    pipe = redis.pipeline(transaction=False)
    total = 0
    for seq, kind in enumerate(KINDS, start=1):
        for n in range(sessions):
            body = command(kind, n, seq)
            shard = shard_of(body["project_id"], body["session_id"], shards)
            pipe.xadd(staging(prefix, shard), {"data": orjson.dumps(body)})
            total += 1
            if len(pipe) >= 2000:
                await pipe.execute()
    await pipe.execute()
    return total


async def results_count(redis: Redis, prefix: str, shards: int) -> int:
    return sum([int(await redis.xlen(StreamKeys(prefix, s).results)) for s in range(shards)])


async def rejections(redis: Redis, prefix: str, shards: int) -> int:
    count = 0
    for shard in range(shards):
        stream = StreamKeys(prefix, shard).results
        last = "-"
        while True:
            rows: Any = await redis.xrange(stream, min=last, count=5000)
            if last != "-":
                rows = rows[1:]
            if not rows:
                break
            count += sum(b'"type":"command.rejected"' in f[b"data"] for _i, f in rows)
            last = rows[-1][0].decode()
    return count


async def measure(redis_url: str, shards: int, processes: int, sessions: int) -> dict[str, Any]:
    prefix = unique_prefix("scaling")
    redis = Redis.from_url(redis_url)
    lifecycle = [StreamKeys(prefix, s).lifecycle for s in range(shards)]
    try:
        total = await prefill(redis, prefix, shards, sessions)
        env = service_env(redis_url, prefix, MEMWORKER_SHARDS=str(shards))
        with services([memworker_command("run", "--workers", str(processes))], env) as procs:
            await wait_for_consumers(redis, lifecycle, LIFECYCLE_GROUP, processes, procs)
            pipe = redis.pipeline(transaction=True)
            pipe.time()
            for shard in range(shards):
                pipe.rename(staging(prefix, shard), lifecycle[shard])
            seconds, micros = (await pipe.execute())[0]
            started_ms = int(seconds) * 1000 + int(micros) // 1000
            deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
            while (done := await results_count(redis, prefix, shards)) < total:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{done} of {total} results after {DRAIN_TIMEOUT_SECONDS}s")
                await asyncio.sleep(0.02)
            last_ms = 0
            for shard in range(shards):
                rows: Any = await redis.xrevrange(StreamKeys(prefix, shard).results, count=1)
                last_ms = max(last_ms, stream_ms(rows[0][0]))
        elapsed = max(last_ms - started_ms, 1) / 1000
        return {
            "commands": total,
            "seconds": elapsed,
            "rate": total / elapsed,
            "rejected": await rejections(redis, prefix, shards),
        }
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()


async def main() -> None:
    cancel_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--sessions", type=int, default=10_000, help="4 commands each")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()

    figures: dict[tuple[int, int], dict[str, Any]] = {}
    for shards in args.shards:
        for processes in args.processes:
            figures[shards, processes] = await measure(
                args.redis_url, shards, processes, args.sessions
            )

    base = figures.get((min(args.shards), min(args.processes)))
    rows = []
    for (shards, processes), fig in figures.items():
        one = figures.get((shards, min(args.processes)))
        efficiency = (
            f"{fig['rate'] / (processes / min(args.processes) * one['rate']):.0%}" if one else ""
        )
        env = f"MEMWORKER_SHARDS={shards} " if shards > 1 else ""
        rows.append(
            [
                f"`{env}memworker run --workers {processes}`",
                str(shards),
                str(processes),
                f"{fig['commands']:,}",
                f"{fig['seconds']:.2f}",
                f"{fig['rate']:,.0f}",
                f"{fig['rate'] / base['rate']:.2f}×" if base else "",
                efficiency,
                f"{fig['rejected']:,}",
            ]
        )
    cpus = os.cpu_count() or 0
    print(f"command: `{invocation()}`")
    print()
    print(
        f"**This machine has {cpus} CPUs**, shared by Redis (about one core at these rates), "
        "every worker process and this script: extra processes mostly compete for the same "
        "cores, so the efficiency column measures the machine as much as the design. "
        f"Python {platform.python_version()}; {args.sessions:,} sessions × spawn (10 variables), "
        "pause, resume, terminate, with `seq`; ratio against 1 process on 1 shard; scaling "
        "efficiency = throughput(N) ÷ (N × throughput(1 process, same shards))."
    )
    print()
    header = [
        "what ran",
        "shards",
        "processes",
        "commands",
        "seconds",
        "commands/s",
        "ratio",
        "scaling efficiency",
        "rejected",
    ]
    print(markdown_table(header, rows, "lrrrrrrrr"))


if __name__ == "__main__":
    asyncio.run(main())
