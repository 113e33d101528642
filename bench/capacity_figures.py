"""Capacity figures at the current settings, as `memworker stats` measures them.

    .venv/bin/python bench/capacity_figures.py [--redis-url URL] [--finished 1000] [--live 200]

A lifecycle worker (in this process) applies, for ``--finished`` sessions, spawn (4 small
variables), pause, resume and terminate (with a lesson), and spawn only for ``--live`` more, all
published with ``LifecycleClient`` (so each session has a seq counter). Then ``memworker stats
--json --rate-seconds 0`` reads every key of the run (``--sample-keys`` above the key count:
exact counts; up to 50 sessions of each kind measured) and the figures of its capacity section
are printed. Then the cost of the capacity gauges: ``--refreshes`` refreshes of the lag probe's
``CapacityProbe`` over the same keys, with the Redis CPU of each sampling command from ``INFO
commandstats`` (other clients of the server count too: use a quiet one) and this process's CPU
time, per refresh.

With ``--fill-mb N`` (20 by default, 0: skipped), the prediction is checked against the
event: on a private server (as ``bench/memory_footprint.py`` starts one), a worker applies
spawns and terminates offered at ``--rate`` commands/s; after 5 s ``maxmemory`` is set to
``used_memory`` + N MB (noeviction), ``memworker stats``'s estimate of the time until full is
read (``measure_capacity``, rate over 2 s), and the publisher goes on until Redis refuses a
command (OOM): predicted and actual seconds are printed.

The key prefix is 6 characters, as long as the default ``agents``, so key names (and bytes)
are those of a default deployment; every key of the run is deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid

from harness import DEFAULT_REDIS_URL, cleanup, invocation, markdown_table
from memory_footprint import private_server, server_binary
from redis.asyncio import Redis

from worker.lifecycle.client import LifecycleClient
from worker.lifecycle.worker import LifecycleWorker
from worker.logs import configure_logging
from worker.ops.capacity import CapacityProbe, measure_capacity
from worker.settings import Settings

FIGURES = (
    "bytes_per_live_session",
    "bytes_per_tombstone",
    "commands_per_session",
    "bytes_per_dedupe_record",
    "bytes_per_finished_session",
    "bytes_per_lifecycle_entry",
    "bytes_per_result_entry",
    "bytes_per_command",
    "byte_seconds_per_command",
    "commands_per_second_per_gb",
)


async def workload(settings: Settings, finished: int, live: int) -> None:
    redis = Redis.from_url(settings.redis_url)
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        client = LifecycleClient(redis, settings)
        state = {"goal": "summarise the docs", "step": 1, "notes": "short", "done": False}
        last = ""
        for n in range(finished + live):
            last = await client.spawn("demo", f"s{n}", "agent-1", state)
            if n < finished:
                await client.pause("demo", f"s{n}", "agent-1")
                await client.resume("demo", f"s{n}", "agent-1")
                last = await client.terminate(
                    "demo", f"s{n}", "agent-1", lessons_learned=["it works"]
                )
        await client.wait(last, timeout=120)
    finally:
        stop.set()
        await running
        await redis.aclose()


SAMPLING_COMMANDS = ("scan", "memory|usage", "hget", "xinfo|stream", "info", "dbsize")


async def command_stats(redis: Redis) -> dict[str, tuple[int, int]]:
    info = await redis.info("commandstats")
    return {
        c: (
            info.get(f"cmdstat_{c}", {}).get("calls", 0),
            info.get(f"cmdstat_{c}", {}).get("usec", 0),
        )
        for c in SAMPLING_COMMANDS
    }


async def probe_cost(settings: Settings, refreshes: int) -> None:
    """Redis and Python CPU per refresh of the capacity gauges."""
    redis = Redis.from_url(settings.redis_url)
    probe = CapacityProbe(settings)
    try:
        before, cpu = await command_stats(redis), time.process_time()
        for _ in range(refreshes):
            await probe.refresh(redis)
        python_ms = (time.process_time() - cpu) / refreshes * 1000
        after = await command_stats(redis)
    finally:
        await redis.aclose()
    rows: list[list[object]] = []
    total = 0.0
    for name in SAMPLING_COMMANDS:
        calls = (after[name][0] - before[name][0]) / refreshes
        usec = (after[name][1] - before[name][1]) / refreshes
        total += usec
        rows.append([f"`{name.upper().replace('|', ' ')}`", f"{calls:.1f}", f"{usec:.1f}"])
    rows.append(["all", "", f"{total:.0f}"])
    print(f"\nCost of one refresh of the capacity gauges ({refreshes} refreshes):\n")
    print(markdown_table(["command", "calls", "Redis µs"], rows, "lrr"))
    print(f"\nPython CPU per refresh: {python_ms:.2f} ms.")


async def fill_until_full(rate: float, fill_mb: float) -> None:
    """Predicted vs actual seconds until a capped Redis refuses commands (see module doc)."""
    async with private_server(server_binary(None)) as url:
        settings = Settings(redis_url=url)
        redis = Redis.from_url(url)
        worker = LifecycleWorker(settings)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        client = LifecycleClient(redis, settings)
        loop = asyncio.get_running_loop()
        started = loop.time()
        predicted: float | None = None
        capped_at = 0.0
        n = 0
        try:
            while True:
                session = f"s{n // 2}"
                try:
                    if n % 2 == 0:
                        await client.spawn("demo", session, "agent-1", {"goal": "x" * 40})
                    else:
                        await client.terminate("demo", session, "agent-1")
                except Exception as exc:  # Redis refuses: an OOM error, however the client words it
                    if not any(w in str(exc) for w in ("OOM", "maxmemory", "full")):
                        raise
                    break
                n += 1
                await asyncio.sleep(max(0.0, started + n / rate - loop.time()))
                if not capped_at and loop.time() - started >= 5:
                    used = int((await redis.info("memory"))["used_memory"])
                    await redis.config_set("maxmemory", str(used + int(fill_mb * 1e6)))
                    capped_at = loop.time()
                    measuring = asyncio.create_task(measure_capacity(redis, settings))
                if capped_at and predicted is None and measuring.done():
                    predicted = measuring.result().seconds_until_full
            actual = loop.time() - capped_at
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await running
            await redis.aclose()
    print(
        f"\nTime until full, predicted and actual: a private Redis capped at used memory + "
        f"{fill_mb:g} MB, spawns and terminates offered at {rate:g}/s: `memworker stats` "
        f"predicted full in {predicted or float('nan'):.1f} s; Redis refused the first command "
        f"after {actual:.1f} s ({n:,} commands)."
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--finished", type=int, default=1000)
    parser.add_argument("--live", type=int, default=200)
    parser.add_argument("--refreshes", type=int, default=200)
    parser.add_argument("--fill-mb", type=float, default=20.0, help="0: no fill check")
    parser.add_argument("--rate", type=float, default=1000.0)
    args = parser.parse_args()
    configure_logging("WARNING")
    print(f"command: `{invocation()}`\n")
    prefix = "c" + uuid.uuid4().hex[:5]  # as long as "agents"
    settings = Settings(redis_url=args.redis_url, stream_prefix=prefix)
    try:
        await workload(settings, args.finished, args.live)
        env = {**os.environ, "REDIS_URL": args.redis_url, "MEMWORKER_STREAM_PREFIX": prefix}
        command = [sys.executable, "-m", "worker.cli", "stats", "--json", "--rate-seconds", "0"]
        stats = subprocess.run(
            [*command, "--sample-keys", "100000000"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        capacity = json.loads(stats.stdout)["capacity"]
        print(
            f"{args.finished:,} sessions spawned (4 small variables), paused, resumed and "
            f"terminated, {args.live:,} more spawned; `memworker stats` at the defaults "
            f"(retention {settings.retention_seconds:g} s, dedupe records "
            f"{settings.dedupe_ttl_seconds} s, tombstones {settings.tombstone_ttl_seconds} s):\n"
        )
        rows = [
            [f"`{name}`", "-" if capacity[name] is None else f"{capacity[name]:,.1f}"]
            for name in FIGURES
        ]
        print(markdown_table(["figure", "value"], rows, "lr"))
        await probe_cost(settings, args.refreshes)
    finally:
        redis = Redis.from_url(args.redis_url)
        await cleanup(redis, prefix)
        await redis.aclose()
    if args.fill_mb:
        await fill_until_full(args.rate, args.fill_mb)


if __name__ == "__main__":
    asyncio.run(main())
