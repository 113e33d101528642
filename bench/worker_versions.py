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
    cpu0 = await redis.info("cpu")
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    started, python0 = time.perf_counter(), time.process_time()
    task = asyncio.create_task(worker.run(stop))
    while int(await redis.xlen(streams.results)) < total:
        await asyncio.sleep(0.01)
    elapsed, python = time.perf_counter() - started, time.process_time() - python0
    cpu1 = await redis.info("cpu")
    stop.set()
    await task
    keys = [k async for k in redis.scan_iter(match=prefix + ":*", count=5000)]
    for i in range(0, len(keys), 5000):
        await redis.unlink(*keys[i:i + 5000])
    await redis.aclose()
    server = sum(float(cpu1[k]) - float(cpu0[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    print(total / elapsed, python / total * 1e6, server / total * 1e6)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def measure(tree: Path, url: str, sessions: int) -> tuple[float, float, float]:
    """Commands/s, the worker process's Python CPU µs per command (``time.process_time``, the
    bench's publishing before it excluded) and Redis CPU µs per command (``INFO cpu`` Δ)."""
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
    rate, python, server = done.stdout.strip().splitlines()[-1].split()
    return float(rate), float(python), float(server)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--before", default="4583134", help="the earlier commit")
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with earlier_checkout(args.before) as tree:
        before: list[tuple[float, float, float]] = []
        after: list[tuple[float, float, float]] = []
        for _ in range(args.rounds):  # alternate, so noise hits both alike
            before.append(await asyncio.to_thread(measure, tree, args.redis_url, args.sessions))
            after.append(await asyncio.to_thread(measure, ROOT, args.redis_url, args.sessions))

    def median(rounds: list[tuple[float, float, float]], i: int) -> float:
        return sorted(r[i] for r in rounds)[len(rounds) // 2]

    b, a = median(before, 0), median(after, 0)
    print(
        f"{args.sessions * 4:,} commands (spawn with 10 keys), median of {args.rounds} "
        "alternating rounds; CPU µs per command: the worker process's Python, and Redis's."
    )
    print()
    columns = ["worker version", "commands/s (median)", "rounds", "ratio"]
    columns += ["Python CPU µs/cmd", "Redis CPU µs/cmd"]
    print("| " + " | ".join(columns) + " |")
    print("|---|---:|---|---:|---:|---:|")
    for name, rounds, rate, ratio in (
        (f"before: commit {args.before}", before, b, 1.0),
        ("after: this checkout", after, a, a / b),
    ):
        print(
            f"| {name} | {rate:,.0f} | {', '.join(f'{r[0]:,.0f}' for r in rounds)} "
            f"| {ratio:.1f}x | {median(rounds, 1):.1f} | {median(rounds, 2):.1f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
