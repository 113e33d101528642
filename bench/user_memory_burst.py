"""User memory's burst with the indexer beside it: 50 agents remembering for 60 s while
``memworker index`` embeds the turns on the same cores; how soon a turn is found by meaning,
how the indexing backlog grows, where it shows, and how it drains after.

    .venv/bin/python bench/user_memory_burst.py [--redis-url URL] [--pgvector-url URL] \\
        [--seconds 60] [--clients 50] [--rate 0]

A fresh database with pgvector (the embedded pgserver unless ``--pgvector-url``), dropped at
the end, and the given Redis under a prefix of its own. ``memworker index`` runs as deployed
(a process, ``MEMWORKER_INDEX_NICE=0``, its probes on a port of its own,
``MEMWORKER_LAG_PROBE_SECONDS=1``); ``Memory.remember`` leaves turns to it
(``MEMWORKER_REMEMBER_EMBEDDING=indexer``). After a warm-up (the first turn waits for the
model to load), ``--clients`` tasks remember turns (each one user, ``bench/user_memory_load.py``'s
turns) for ``--seconds``, as fast as answered (``--rate 0``) or paced at ``--rate`` in all.
Freshness is a turn's time from ``remember`` returning to its ``episode.recallable`` on the
change feed (``follow_changes``). Every second, during the burst and after it until every turn
is recallable: the backlog as ``memworker stats`` reads it (``indexing_backlog``), the
indexer's ``memworker_index_backlog`` on ``/metrics`` and its ``/readyz`` status.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import time

import httpx
from harness import (
    DEFAULT_REDIS_URL,
    cleanup,
    fresh_database,
    invocation,
    markdown_table,
    memworker_command,
    percentile,
    service_env,
    services,
    unique_prefix,
)
from recall_common import pgvector_server
from redis.asyncio import Redis
from user_memory_load import drive, free_port, ms, turn

from schemas.streams import ChangeEvent
from worker.db.engine import create_database_engine
from worker.episodes.backlog import indexing_backlog
from worker.settings import Settings
from worker.user_memory.feed import follow_changes
from worker.user_memory.memory import Memory

PROJECT = "burst"
METRIC = re.compile(rb"^memworker_index_backlog(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


async def run(args: argparse.Namespace) -> str:
    load_before = os.getloadavg()[0]
    prefix = unique_prefix("user-memory-burst")
    redis = Redis.from_url(args.redis_url)
    samples: list[list[str]] = []
    lags: list[float] = []
    try:
        with pgvector_server(args.pgvector_url) as admin:
            async with fresh_database(admin) as url:
                settings = Settings(
                    redis_url=args.redis_url,
                    stream_prefix=prefix,
                    database_url=url,
                    remember_embedding="indexer",
                )
                port = free_port()
                env = service_env(
                    args.redis_url,
                    prefix,
                    url,
                    MEMWORKER_INDEX_NICE="0",
                    MEMWORKER_METRICS_PORT=str(port),
                    MEMWORKER_LAG_PROBE_SECONDS="1",
                )
                engine = create_database_engine(url)
                remembered_at: dict[str, float] = {}

                async def on_change(event: ChangeEvent) -> None:
                    if event.type == "episode.recallable":
                        at = remembered_at.pop(event.episode_id, None)
                        if at is not None:
                            lags.append(time.time() - at)

                stop, ready = asyncio.Event(), asyncio.Event()
                with services([memworker_command("index")], env) as (indexer,):
                    following = asyncio.create_task(
                        follow_changes(
                            on_change, "bench", stop=stop, ready=ready, settings=settings
                        )
                    )
                    await asyncio.wait_for(ready.wait(), 60)
                    memory = Memory(PROJECT, settings=settings, engine=engine, redis=redis)
                    warm = turn("warm", 0, 0)
                    remembered_at[warm.id] = time.time()
                    await memory.remember(warm)
                    async with asyncio.timeout(300):  # the model loads in `memworker index`
                        while remembered_at:
                            if indexer.poll() is not None:
                                error = indexer.stderr.read() if indexer.stderr else b""
                                raise RuntimeError(f"memworker index exited: {error[-2000:]!r}")
                            await asyncio.sleep(0.1)
                    lags.clear()

                    started = time.time()
                    probe = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5)

                    async def sample() -> int:
                        backlog = await indexing_backlog(redis, prefix)
                        metric, ready_ = "–", "–"
                        try:
                            scraped = METRIC.search((await probe.get("/metrics")).content)
                            metric = scraped.group(1).decode() if scraped else "absent"
                            ready_ = str((await probe.get("/readyz")).status_code)
                        except httpx.HTTPError as exc:
                            metric = ready_ = type(exc).__name__
                        age = backlog.oldest_age_s()
                        samples.append(
                            [
                                f"{time.time() - started:.0f}",
                                f"{backlog.episodes:,}",
                                "–" if age is None else f"{age:.1f}",
                                metric,
                                ready_,
                                f"{len(lags):,}",
                            ]
                        )
                        return backlog.episodes

                    async def sampling(until: asyncio.Event) -> None:
                        while not until.is_set():
                            await sample()
                            await asyncio.sleep(1)

                    async def remember(c: int, n: int) -> object:
                        episode = turn("b", c, n)
                        remembered_at[episode.id] = time.time()  # in case it is indexed first
                        await memory.remember(episode)
                        if episode.id in remembered_at:
                            remembered_at[episode.id] = time.time()
                        return None

                    burst_over = asyncio.Event()
                    sampler = asyncio.create_task(sampling(burst_over))
                    point = await drive(
                        remember, None, args.clients, args.seconds, args.rate or None
                    )
                    burst_over.set()
                    await sampler
                    drained = None
                    try:  # a backlog left after --drain is reported, not raised
                        async with asyncio.timeout(args.drain):
                            while (await sample()) or remembered_at:  # sampled every second
                                await asyncio.sleep(1)
                            drained = time.time() - started - point.seconds
                    except TimeoutError:
                        pass
                    await probe.aclose()
                    stop.set()
                    await following
                    await memory.close()
                await engine.dispose()
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    shown = samples[:: max(1, len(samples) // 25)]
    indexed = len(lags)
    return (
        f"`{invocation()}` — {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; load average {load_before:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end\n\n"
        f"- burst: {args.clients} clients, {args.seconds:g} s, offered "
        f"{'max' if not args.rate else f'{args.rate:g}/s'}: {point.rate():,.0f} remembers/s, "
        f"p50 {ms(point.remember, 50)} ms, p99 {ms(point.remember, 99)} ms, "
        f"{point.errors} errors\n"
        f"- {indexed:,} turns recallable by meaning; remember → `episode.recallable`: "
        f"p50 {percentile(lags, 50):.2f} s, p99 {percentile(lags, 99):.2f} s, "
        f"max {max(lags):.2f} s\n"
        f"- the indexer's rate over the whole run: "
        f"{indexed / (point.seconds + (args.drain if drained is None else drained)):,.0f}"
        " turns/s; backlog "
        + (
            f"not drained {args.drain:g} s after the burst (--drain): {samples[-1][1]} left"
            if drained is None
            else f"drained {drained:.0f} s after the burst"
        )
        + "\n\n"
        + markdown_table(
            [
                "s since start",
                "backlog (stats)",
                "oldest unindexed s",
                "`memworker_index_backlog`",
                "indexer `/readyz`",
                "recallable so far",
            ],
            shown,
            "rrrrrr",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--pgvector-url", default=None)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=float, default=0.0, help="remembers/s in all; 0: max")
    parser.add_argument("--drain", type=float, default=900.0, help="seconds to wait after")
    print(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
