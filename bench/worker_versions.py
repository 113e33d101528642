"""Before and after: one worker process's commands/s for an earlier commit of the worker
and for this checkout, on the same prefilled stream shape, in the same run.

The earlier version is checked out into a temporary git worktree and run in a subprocess with
that tree on ``PYTHONPATH``; both use only the API they share (``LifecycleWorker.run``).

    .venv/bin/python bench/worker_versions.py [--before 4583134] [--sessions 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

from harness import DEFAULT_REDIS_URL, earlier_checkout

ROOT = Path(__file__).resolve().parent.parent

RUNNER = r"""
import asyncio, sys, time, uuid, orjson
from redis.asyncio import Redis
from worker.keys import StreamKeys
try:  # this checkout, or an earlier one (--before) from before the packages
    from worker.consumers.groups import ensure_group
    from worker.lifecycle.worker import LifecycleWorker
except ImportError:
    from worker.lifecycle import LifecycleWorker, ensure_group
from worker.logs import configure_logging
from worker.settings import Settings

async def main(url, sessions):
    configure_logging("WARNING")
    redis = Redis.from_url(url)
    prefix = "bench-versions-" + uuid.uuid4().hex[:8]
    settings = Settings(redis_url=url, stream_prefix=prefix)
    streams = StreamKeys(prefix, 0)
    await ensure_group(redis, streams.lifecycle, "lifecycle")
    pipe = redis.pipeline(transaction=False)
    total = 0
    for seq, kind in enumerate(["spawn", "pause", "resume", "terminate"], start=1):
        for n in range(sessions):
            body = {"type": kind, "event_id": f"s{n}-{seq}", "project_id": "bench",
                    "session_id": f"s{n}", "agent_instance_id": "a", "seq": seq}
            if kind == "spawn":
                body["initial_state"] = {f"k{i}": {"v": i, "note": "x" * 20} for i in range(10)}
            pipe.xadd(streams.lifecycle, {"data": orjson.dumps(body)})
            total += 1
            if len(pipe) >= 2000:
                await pipe.execute()
    await pipe.execute()
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(worker.run(stop))
    while int(await redis.xlen(streams.results)) < total:
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    keys = [k async for k in redis.scan_iter(match=prefix + ":*", count=5000)]
    for i in range(0, len(keys), 5000):
        await redis.unlink(*keys[i:i + 5000])
    await redis.aclose()
    print(total / elapsed)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def measure(tree: Path, url: str, sessions: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, url, str(sessions)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(done.stdout.strip().splitlines()[-1])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--before", default="4583134", help="the earlier commit")
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with earlier_checkout(args.before) as tree:
        before: list[float] = []
        after: list[float] = []
        for _ in range(args.rounds):  # alternate, so noise hits both alike
            before.append(await asyncio.to_thread(measure, tree, args.redis_url, args.sessions))
            after.append(await asyncio.to_thread(measure, ROOT, args.redis_url, args.sessions))
    b, a = sorted(before)[len(before) // 2], sorted(after)[len(after) // 2]
    print(
        f"{args.sessions * 4:,} commands (spawn with 10 keys), median of {args.rounds} "
        "alternating rounds."
    )
    print()
    print("| worker version | commands/s (median) | rounds | ratio |")
    print("|---|---:|---|---:|")
    print(
        f"| before: commit {args.before} (redis-py pipeline per batch) | {b:,.0f} "
        f"| {', '.join(f'{x:,.0f}' for x in before)} | 1.0x |"
    )
    print(
        f"| after: this checkout | {a:,.0f} | {', '.join(f'{x:,.0f}' for x in after)} "
        f"| {a / b:.1f}x |"
    )


if __name__ == "__main__":
    asyncio.run(main())
