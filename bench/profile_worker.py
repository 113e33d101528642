"""Where one worker process spends its time at full load: cProfile of ``LifecycleWorker``
draining a prefilled stream, top functions by own time.

    .venv/bin/python bench/profile_worker.py [--sessions 5000] [--top 20]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import uuid

from lifecycle_throughput import batched, cleanup, prefill
from redis.asyncio import Redis

from worker.logs import configure_logging
from worker.settings import Settings


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    configure_logging("WARNING")
    redis = Redis.from_url(args.redis_url)
    settings = Settings(redis_url=args.redis_url, stream_prefix=f"bench-{uuid.uuid4().hex[:8]}")
    try:
        total = await prefill(redis, settings, args.sessions)
        profile = cProfile.Profile()
        profile.enable()
        rate = await batched(redis, settings, total)
        profile.disable()
    finally:
        await cleanup(redis, settings.stream_prefix)
        await redis.aclose()
    print(f"{total} commands at {rate:,.0f}/s under the profiler")
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    asyncio.run(main())
