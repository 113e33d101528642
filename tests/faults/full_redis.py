"""A Redis capped by ``maxmemory`` (noeviction) under an offered load above what fits: the
scenario shared by the fault test (bounded) and ``bench/soak_full_redis.py`` (longer).

Orchestrators publish spawn (with a state of ``state_bytes``) then terminate for each of
``sessions`` sessions, ``publishers`` at a time, as fast as Redis accepts. A refused publish
(``RedisConditionError``) is counted and retried with the same ``event_id`` after a short pause,
as an orchestrator should. A lifecycle worker and a consolidator run in this process; retention
and the dedupe/tombstone windows are short, so memory turns over. Redis's ``used_memory`` is
sampled throughout.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis

from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.keys import CONSOLIDATION_GROUP, LIFECYCLE_GROUP, StreamKeys, episodes_stream
from worker.lifecycle.client import LifecycleClient
from worker.lifecycle.worker import LifecycleWorker
from worker.redis_conditions import RedisConditionError
from worker.settings import Settings


@dataclass
class FullRedisReport:
    maxmemory: int
    """The cap in force at the end (raised by the operator on a stall)."""
    first_cap: int = 0
    raises: int = 0
    stalls: list[dict[str, int]] = field(default_factory=list)
    """At each raise: what held the memory (stream lengths, pending entries, keys)."""
    peak_used: int = 0
    peak_over_cap: float = 0.0
    """Raw ``used_memory`` over the cap read in the same INFO reply."""
    peak_counted_over_cap: float = 0.0
    """What Redis compares with ``maxmemory`` (``used_memory - mem_not_counted_for_evict``)
    over the cap, both from one INFO reply."""
    peak_data_over_cap: int = 0
    """Bytes by which data (what Redis counts, less clients' buffers) passed the cap, at most."""
    at_peak: dict[str, Any] = field(default_factory=dict)
    """One pipeline at the sample with the highest counted ratio: memory figures, stream
    lengths, pending entries, keys, streams' MEMORY USAGE, commands run since the last sample."""
    samples: int = 0
    offered: int = 0
    accepted: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    refusal: str = ""
    results: Counter[str] = field(default_factory=Counter)
    dead_letters: int = 0
    dead_letter_reasons: list[dict[str, str]] = field(default_factory=list)
    worker_exited: bool = False
    consolidator_exited: bool = False
    seconds: float = 0.0

    @property
    def missing(self) -> list[str]:
        return [e for e in self.accepted if e not in self.results]

    @property
    def duplicated(self) -> int:
        return sum(n - 1 for n in self.results.values() if n > 1)

    def summary(self) -> dict[str, Any]:
        return {
            "first_cap_mb": round(self.first_cap / 2**20, 2),
            "final_cap_mb": round(self.maxmemory / 2**20, 2),
            "cap_raises_after_stalls": self.raises,
            "stalls": self.stalls[:3],
            "peak_used_mb": round(self.peak_used / 2**20, 2),
            "peak_used_over_cap_then": round(self.peak_over_cap, 3),
            "peak_counted_over_cap_then": round(self.peak_counted_over_cap, 4),
            "peak_data_over_cap_bytes": self.peak_data_over_cap,
            "at_peak": self.at_peak,
            "samples": self.samples,
            "offered": self.offered,
            "accepted": len(self.accepted),
            "refused": dict(self.refused),
            "results": sum(self.results.values()),
            "missing": len(self.missing),
            "duplicated": self.duplicated,
            "dead_letters": self.dead_letters,
            "dead_letter_reasons": self.dead_letter_reasons,
            "worker_exited": self.worker_exited,
            "consolidator_exited": self.consolidator_exited,
            "seconds": round(self.seconds, 1),
            "refusal": self.refusal,
        }


async def run_full_redis(
    redis_url: str,
    database_url: str,
    prefix: str,
    *,
    maxmemory: int,
    sessions: int,
    state_bytes: int = 8_000,
    publishers: int = 8,
    drain_timeout: float = 300.0,
    stall_s: float = 3.0,
) -> FullRedisReport:
    settings = Settings(
        redis_url=redis_url,
        database_url=database_url,
        stream_prefix=prefix,
        retention_seconds=5.0,  # the tail below reads results well within it
        retention_interval_seconds=0.5,
        dedupe_ttl_seconds=5,
        tombstone_ttl_seconds=5,
    )
    admin = Redis.from_url(redis_url)
    report = FullRedisReport(maxmemory, first_cap=maxmemory)
    worker = LifecycleWorker(settings)
    engine = create_database_engine(database_url)
    consolidator = Consolidator(settings, admin, engine, block_ms=100, backoff_max_s=0.5)
    stop, sampling = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)), asyncio.create_task(consolidator.run(stop))]

    tail_done = asyncio.Event()
    tailer = asyncio.create_task(
        tail_results(Redis.from_url(redis_url), settings, report, tail_done)
    )

    keys0 = StreamKeys(prefix, 0)
    watched = {
        "lifecycle": keys0.lifecycle,
        "results": keys0.results,
        "episodes": episodes_stream(prefix),
    }

    async def snapshot() -> dict[str, Any]:
        """Memory as Redis counts it, and what holds it, in one pipeline (not a MULTI: a full
        Redis refuses to queue commands in a MULTI; INFO memory is one reply either way)."""
        pipe = admin.pipeline(transaction=False)
        pipe.info("memory")
        pipe.info("commandstats")
        pipe.dbsize()
        for stream in watched.values():
            pipe.xlen(stream)
            pipe.memory_usage(stream, samples=0)
        pipe.xpending(keys0.lifecycle, LIFECYCLE_GROUP)
        pipe.xpending(keys0.results, CONSOLIDATION_GROUP)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        info, stats, keys = replies[0], replies[1], replies[2]
        out: dict[str, Any] = {
            "used": int(info["used_memory"]),
            "maxmemory": int(info["maxmemory"]),
            "not_counted": int(info.get("mem_not_counted_for_evict", 0)),
            "clients_normal": int(info.get("mem_clients_normal", 0)),
            # Where the rest goes, as Redis breaks it down (for a peak that is not data).
            "overhead": int(info.get("used_memory_overhead", 0)),
            "dataset": int(info.get("used_memory_dataset", 0)),
            "startup": int(info.get("used_memory_startup", 0)),
            "lazyfree_pending": int(info.get("lazyfree_pending_objects", 0)),
            "replication_buffers": int(info.get("mem_total_replication_buffers", 0)),
            "keys": int(keys),
            "calls": {k: int(v["calls"]) for k, v in stats.items() if isinstance(v, dict)},
        }
        for n, name in enumerate(watched):
            length, usage = replies[3 + 2 * n], replies[4 + 2 * n]
            out[f"{name}_len"] = int(length) if isinstance(length, int) else 0
            out[f"{name}_bytes"] = int(usage) if isinstance(usage, int) else 0
        for name, reply in zip(("lifecycle", "results"), replies[-2:], strict=True):
            out[f"{name}_pending"] = int(reply["pending"]) if isinstance(reply, dict) else 0
        return out

    async def sample() -> None:
        calls: dict[str, int] = {}
        while not sampling.is_set():
            now = await snapshot()
            report.samples += 1
            used, cap = now["used"], now["maxmemory"] or report.maxmemory
            counted = used - now["not_counted"]
            report.peak_used = max(report.peak_used, used)
            report.peak_over_cap = max(report.peak_over_cap, used / cap)
            data = counted - now["clients_normal"]
            report.peak_data_over_cap = max(report.peak_data_over_cap, data - cap)
            if counted / cap > report.peak_counted_over_cap:
                report.peak_counted_over_cap = counted / cap
                since = {
                    k.removeprefix("cmdstat_"): v - calls.get(k, 0)
                    for k, v in now["calls"].items()
                    if v > calls.get(k, 0)
                }
                report.at_peak = {
                    **{k: v for k, v in now.items() if k != "calls"},
                    "calls_since_last_sample": since,
                }
            calls = now["calls"]
            await asyncio.sleep(0.01)

    async def holders() -> dict[str, int]:
        keys = StreamKeys(prefix, 0)
        lifecycle: Any = await admin.xpending(keys.lifecycle, LIFECYCLE_GROUP)
        results: Any = await admin.xpending(keys.results, CONSOLIDATION_GROUP)
        return {
            "used": int((await admin.info("memory"))["used_memory"]),
            "keys": int(await admin.dbsize()),
            "lifecycle_len": int(await admin.xlen(keys.lifecycle)),
            "lifecycle_pending": int(lifecycle["pending"]),
            "results_len": int(await admin.xlen(keys.results)),
            "results_pending": int(results["pending"]),
            "episodes_len": int(await admin.xlen(episodes_stream(prefix))),
        }

    async def operator() -> None:
        """When nothing moves for ``stall_s`` while work is outstanding, raise maxmemory by a
        quarter, as a person paged by the alert would."""
        seen, still = -1, 0.0
        while not sampling.is_set():
            await asyncio.sleep(0.5)
            now = sum(report.results.values())
            still = still + 0.5 if now == seen else 0.0
            seen = now
            if still >= stall_s:
                report.stalls.append(await holders())
                report.maxmemory = int(report.maxmemory * 1.25)
                report.raises += 1
                await admin.config_set("maxmemory", str(report.maxmemory))
                still = 0.0

    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(sessions):
        queue.put_nowait(n)
    state = {"notes": "x" * state_bytes}

    async def orchestrator() -> None:
        client = LifecycleClient(Redis.from_url(redis_url), settings)
        try:
            while not queue.empty():
                n = queue.get_nowait()
                session = f"s{n}"
                await publish(client, {"type": "spawn", "initial_state": state}, session)
                await publish(client, {"type": "terminate", "lessons_learned": ["ok"]}, session)
        finally:
            await client.redis.aclose()

    async def publish(client: LifecycleClient, command: dict[str, Any], session: str) -> None:
        body = {
            **command,
            "event_id": uuid.uuid4().hex,
            "project_id": "soak",
            "session_id": session,
            "agent_instance_id": "a",
        }
        while True:
            report.offered += 1
            try:
                report.accepted.append(await client.publish(body))
                return
            except RedisConditionError as refused:
                report.refused[refused.condition.kind] += 1
                report.refusal = report.refusal or str(refused)
                await asyncio.sleep(0.05)

    started = time.monotonic()
    await admin.config_set("maxmemory-policy", "noeviction")
    # Exact client memory: with maxmemory-clients set, Redis (and Valkey) update each client's
    # memory after every command; without it mem_clients_normal is refreshed by a cron, so a
    # read's fresh reply buffer (the worker's XREADGROUP of 8 KB commands: MBs) showed in
    # used_memory but not yet among clients' buffers, i.e. as data over the cap. 1 GB: never
    # reached here, nothing is evicted.
    await admin.config_set("maxmemory-clients", "1gb")
    await admin.config_set("maxmemory", str(maxmemory))
    sampler = asyncio.create_task(sample())
    raiser = asyncio.create_task(operator())
    try:
        await asyncio.gather(*(orchestrator() for _ in range(publishers)))
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline and any(not t.done() for t in tasks):
            if not report.missing:
                break
            await asyncio.sleep(0.5)
    finally:
        report.seconds = time.monotonic() - started
        report.worker_exited = tasks[0].done()
        report.consolidator_exited = tasks[1].done()
        sampling.set()
        await sampler
        await raiser
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        tail_done.set()
        await tailer
        dlq = StreamKeys(prefix, 0).dlq
        report.dead_letters = int(await admin.xlen(dlq))
        letters: Any = await admin.xrange(dlq, count=5)
        for _id, fields in letters:
            report.dead_letter_reasons.append(
                {k.decode(): v.decode()[:300] for k, v in fields.items() if k != b"data"}
            )
        await admin.config_set("maxmemory", "0")
        await engine.dispose()
        await admin.aclose()
    return report


async def tail_results(
    redis: Redis, settings: Settings, report: FullRedisReport, done: asyncio.Event
) -> None:
    """Count results per command as the worker writes them, ahead of retention's trimming."""
    stream = StreamKeys(settings.stream_prefix, 0).results
    last = "0-0"
    while True:
        reply: Any = await redis.xread({stream: last}, count=1000, block=100)
        for _stream, rows in reply or []:
            for entry_id, fields in rows:
                last = entry_id
                report.results[orjson.loads(fields[b"data"])["causation_id"]] += 1
        if not reply and done.is_set():
            return
