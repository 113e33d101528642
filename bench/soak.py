"""Soak: a steady command load against one ``memworker run`` subprocess for N minutes, sampling
the worker's resident memory (``VmRSS`` in ``/proc/<pid>/status``) as it goes.

Sessions are spawned, paused, resumed and terminated (with ``seq``) at a fixed rate; retention
runs as in production (short periods, so the streams stay small), and every result is read back
and counted, so the run also checks that nothing was lost or applied twice.

    .venv/bin/python bench/soak.py [--redis-url URL] [--minutes 10] [--rate 1000]

Without ``--redis-url`` (or ``REDIS_URL``) it starts an embedded Valkey. Exit status 1 when a
command got no result or two results, or when RSS grew more than ``--max-growth-mb`` between
the end of the warm-up and the end of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio import Redis

from worker.consumers.groups import ensure_group
from worker.keys import LIFECYCLE_GROUP, StreamKeys
from worker.ops.embedded import EmbeddedRedis

KINDS = ("spawn", "pause", "resume", "terminate")
TICK = 0.1


@dataclass
class Tally:
    published: int = 0
    results: int = 0
    rejected: int = 0
    duplicated: int = 0
    seen: set[str] = field(default_factory=set)


@dataclass
class Sample:
    elapsed: float
    published: int
    results: int
    lag: int
    rss_kb: int
    redis_mb: float


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` in kB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def body(kind: str, session: str, seq: int) -> bytes:
    cmd: dict[str, Any] = {
        "type": kind,
        "event_id": f"{session}-{seq}",
        "project_id": "soak",
        "session_id": session,
        "agent_instance_id": "agent",
        "seq": seq,
    }
    if kind == "spawn":
        cmd["initial_state"] = {f"k{i}": {"v": i, "note": "x" * 40} for i in range(10)}
    if kind == "terminate":
        cmd["consolidate"] = True
        cmd["lessons_learned"] = ["keep it steady"]
    return orjson.dumps(cmd)


async def publisher(redis: Redis, stream: str, rate: int, until: float, tally: Tally) -> None:
    """Each tick spawns a wave of sessions (until ``until``) and moves the three previous
    waves one step on, so the load is steady and every session ends terminated."""
    per_wave = max(1, int(rate * TICK) // len(KINDS))
    waves = 0
    tick = 0
    next_at = time.monotonic()
    while waves == 0 or tick - (len(KINDS) - 1) < waves:
        if time.monotonic() < until:
            waves = tick + 1
        pipe = redis.pipeline(transaction=False)
        for step, kind in enumerate(KINDS):
            wave = tick - step
            if 0 <= wave < waves:
                for i in range(per_wave):
                    pipe.xadd(stream, {"data": body(kind, f"w{wave}-{i}", step + 1)})
        n = len(pipe)
        if n:
            await pipe.execute()
            tally.published += n
        tick += 1
        next_at += TICK
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def reader(redis: Redis, stream: str, tally: Tally, done: asyncio.Event) -> None:
    last = "0-0"
    while not done.is_set():
        reply: Any = await redis.xread({stream: last}, count=5000, block=200)
        for _stream, rows in reply or []:
            for entry_id, fields in rows:
                last = entry_id.decode()
                result = orjson.loads(fields[b"data"])
                cause = result["causation_id"]
                if cause in tally.seen:
                    tally.duplicated += 1
                else:
                    tally.seen.add(cause)
                tally.results += 1
                if result["type"] == "command.rejected":
                    tally.rejected += 1


async def cleanup(redis: Redis, prefix: str) -> None:
    batch: list[Any] = []
    async for key in redis.scan_iter(match=f"{prefix}:*", count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            await redis.unlink(*batch)
            batch.clear()
    if batch:
        await redis.unlink(*batch)


def start_worker(redis_url: str, prefix: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        {
            "REDIS_URL": redis_url,
            "MEMWORKER_STREAM_PREFIX": prefix,
            "MEMWORKER_LOG_LEVEL": "WARNING",
            "MEMWORKER_LOG_JSON": "true",
            # Production-like retention, shortened so a 10-minute run reaches a steady state.
            "MEMWORKER_RETENTION_SECONDS": "30",
            "MEMWORKER_RETENTION_INTERVAL_SECONDS": "5",
            "MEMWORKER_DEDUPE_TTL_SECONDS": "120",
            "MEMWORKER_TOMBSTONE_TTL_SECONDS": "120",
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "run", "--consumer", "soak"],
        env=env,
        stdout=subprocess.DEVNULL,
    )


async def soak(
    redis_url: str, minutes: float, rate: int, every: float, warmup: float, max_growth_mb: float
) -> int:
    prefix = f"soak-{uuid.uuid4().hex[:8]}"
    streams = StreamKeys(prefix, 0)
    redis = Redis.from_url(redis_url)
    await ensure_group(redis, streams.lifecycle, LIFECYCLE_GROUP)
    proc = start_worker(redis_url, prefix)
    tally = Tally()
    samples: list[Sample] = []
    done = asyncio.Event()
    started = time.monotonic()
    until = started + minutes * 60
    read_task = asyncio.create_task(reader(redis, streams.results, tally, done))
    pub_task = asyncio.create_task(publisher(redis, streams.lifecycle, rate, until, tally))
    print(
        f"soak: {minutes:g} min at {rate} commands/s, worker pid {proc.pid}, "
        f"prefix {prefix}, {platform.python_implementation()} {platform.python_version()}",
        flush=True,
    )
    print("| elapsed s | published | results | lag | worker RSS MB | Redis used MB |")
    print("|---:|---:|---:|---:|---:|---:|", flush=True)
    try:
        while not pub_task.done():
            await asyncio.sleep(min(every, max(0.1, until - time.monotonic() + 1)))
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited with status {proc.returncode}")
            info: Any = await redis.info("memory")
            sample = Sample(
                time.monotonic() - started,
                tally.published,
                tally.results,
                tally.published - tally.results,
                rss_kb(proc.pid),
                int(info["used_memory"]) / 1e6,
            )
            samples.append(sample)
            print(
                f"| {sample.elapsed:.0f} | {sample.published:,} | {sample.results:,} | "
                f"{sample.lag:,} | {sample.rss_kb / 1024:.1f} | {sample.redis_mb:.1f} |",
                flush=True,
            )
        await pub_task
        deadline = time.monotonic() + 120
        while len(tally.seen) < tally.published and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        final_rss = rss_kb(proc.pid)
    finally:
        done.set()
        await read_task
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        await cleanup(redis, prefix)
        await redis.aclose()
    steady = [s for s in samples if s.elapsed >= warmup] or samples
    first, peak = steady[0], max(s.rss_kb for s in steady)
    lost = tally.published - len(tally.seen)
    growth = (final_rss - first.rss_kb) / 1024
    print()
    print(f"commands published: {tally.published:,}; results: {tally.results:,}")
    print(f"lost: {lost}; duplicated: {tally.duplicated}; rejected: {tally.rejected}")
    print(
        f"worker RSS: {samples[0].rss_kb / 1024:.1f} MB at {samples[0].elapsed:.0f}s, "
        f"{first.rss_kb / 1024:.1f} MB after warm-up ({first.elapsed:.0f}s), "
        f"{final_rss / 1024:.1f} MB at the end, peak {peak / 1024:.1f} MB; "
        f"growth after warm-up {growth:+.1f} MB",
        flush=True,
    )
    ok = lost == 0 and tally.duplicated == 0 and tally.rejected == 0 and growth <= max_growth_mb
    return 0 if ok else 1


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=1000, help="commands per second")
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--warmup-seconds", type=float, default=60.0)
    parser.add_argument("--max-growth-mb", type=float, default=20.0)
    args = parser.parse_args()
    embedded: EmbeddedRedis | None = None
    url = args.redis_url
    if not url:
        embedded = EmbeddedRedis()
        url = embedded.start()
    try:
        status = await soak(
            url,
            args.minutes,
            args.rate,
            args.sample_seconds,
            args.warmup_seconds,
            args.max_growth_mb,
        )
    finally:
        if embedded is not None:
            embedded.stop()
    return status


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
