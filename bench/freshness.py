"""Freshness (#25): how soon a finished session is recallable by meaning, at a steady rate.

    python bench/freshness.py --redis-url redis://127.0.0.1:6379/0 [--pgvector-url URL] \\
        [--rate 100] [--seconds 30]

Runs ``memworker consolidate`` and ``memworker index`` as processes (as deployed) on a fresh
database with pgvector (the embedded pgserver unless ``--pgvector-url``), then publishes
``agent.terminated`` results at ``--rate`` per second for ``--seconds`` (each a new session with
its own task). For each session it takes the time from its result's XADD to the
``episode.recallable`` event on the change feed (the public API a caller waits on:
``follow_changes``), and reports p50/p95/p99 and max, per third of the run (growth means the
indexer falls behind), then checks a sample with ``EpisodeStore.recall`` by meaning.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import orjson
from consolidation_throughput import terminated_result
from harness import (
    DEFAULT_REDIS_URL,
    cleanup,
    fresh_database,
    memworker_command,
    percentile,
    service_env,
    services,
)
from recall_common import pgvector_server
from redis.asyncio import Redis

from schemas.streams import ChangeEvent
from worker.db.engine import create_database_engine
from worker.db.models import episode_id_for
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.store import EpisodeStore
from worker.keys import StreamKeys
from worker.settings import Settings
from worker.user_memory.feed import follow_changes

TOPICS = ("invoices", "login outages", "search ranking", "data migrations", "release notes")


def result(i: int, run: str) -> dict[str, Any]:
    body = terminated_result(i)
    body["project_id"] = "fresh"
    body["session_id"] = f"{run}-{i}"
    body["task_description"] = f"Session {i}: investigate {TOPICS[i % len(TOPICS)]} for team {i}"
    body["occurred_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return body


async def run(args: argparse.Namespace) -> None:
    prefix = f"fresh{uuid.uuid4().hex[:8]}"
    redis = Redis.from_url(args.redis_url)
    with pgvector_server(args.pgvector_url) as admin:
        async with fresh_database(admin) as url:
            settings = Settings(redis_url=args.redis_url, stream_prefix=prefix, database_url=url)
            env = service_env(args.redis_url, prefix, url, MEMWORKER_INDEX_NICE="0")
            commands = [memworker_command("consolidate"), memworker_command("index")]
            sent_at: dict[str, float] = {}
            lags: list[tuple[float, float]] = []  # (sent at, seconds to recallable)
            stop, ready = asyncio.Event(), asyncio.Event()

            async def on_change(event: ChangeEvent) -> None:
                if event.type == "episode.recallable":
                    key = event.episode_id
                    if key in sent_at:
                        lags.append((sent_at[key], time.time() - sent_at.pop(key)))

            with services(commands, env):
                following = asyncio.create_task(
                    follow_changes(on_change, "bench", stop=stop, ready=ready, settings=settings)
                )
                await asyncio.wait_for(ready.wait(), 30)
                # warm-up: the first episode waits for the model to load in `memworker index`
                stream = StreamKeys(prefix, 0).results
                warm = result(0, "warm")
                sent_at[str(episode_id_for(warm["event_id"]))] = time.time()
                await redis.xadd(stream, {"data": orjson.dumps(warm)})
                async with asyncio.timeout(120):
                    while sent_at:
                        await asyncio.sleep(0.05)
                lags.clear()
                total = int(args.rate * args.seconds)
                started = time.perf_counter()
                for i in range(total):
                    due = started + i / args.rate
                    if (delay := due - time.perf_counter()) > 0:
                        await asyncio.sleep(delay)
                    body = result(i, "s")
                    sent_at[str(episode_id_for(body["event_id"]))] = time.time()
                    await redis.xadd(stream, {"data": orjson.dumps(body)})
                async with asyncio.timeout(300):
                    while sent_at:
                        await asyncio.sleep(0.1)
                stop.set()
                await following
            engine = create_database_engine(url)
            store = EpisodeStore(engine, LocalEmbedder())
            sample = [i for i in range(0, total, max(1, total // 20))]
            found = 0
            for i in sample:
                query = f"Session {i}: look into {TOPICS[i % len(TOPICS)]} for team {i}"
                hits = await store.recall("fresh", query, 5, mode="vector")
                found += any(h.episode.session_id == f"s-{i}" for h in hits)
            await engine.dispose()
    await cleanup(redis, prefix)
    await redis.aclose()
    report(args, lags, found, len(sample))


def report(
    args: argparse.Namespace, lags: list[tuple[float, float]], found: int, sampled: int
) -> None:
    lags.sort()
    values = [lag for _at, lag in lags]
    third = max(1, len(lags) // 3)
    print(f"{len(values)} sessions at {args.rate}/s for {args.seconds} s")
    print(
        "terminate result → episode.recallable: "
        f"p50 {percentile(values, 50):.2f} s, p95 {percentile(values, 95):.2f} s, "
        f"p99 {percentile(values, 99):.2f} s, max {max(values):.2f} s"
    )
    for n, part in enumerate((lags[:third], lags[third : 2 * third], lags[2 * third :]), 1):
        seconds = [lag for _at, lag in part]
        print(
            f"  third {n}: p50 {statistics.median(seconds):.2f} s,"
            f" p99 {percentile(seconds, 99):.2f} s"
        )
    print(f"recall by meaning found {found} of {sampled} sampled sessions in its top 5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--pgvector-url", default=None)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
