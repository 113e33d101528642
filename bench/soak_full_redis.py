"""Soak against a full Redis: an offered load above what ``maxmemory`` holds.

    .venv/bin/python bench/soak_full_redis.py [--sessions 5000] [--headroom-mb 4]

Starts its own ``redis-server`` (never touches a shared one), caps it at its used memory plus
``--headroom-mb`` (noeviction), and runs the scenario of ``tests/faults/full_redis.py``:
orchestrators publish spawn (8 KB state) + terminate as fast as Redis accepts, retrying a
refusal with the same ``event_id``; a worker and a consolidator run in this process. When
nothing moves for 3 s the cap is raised by a quarter, as an operator paged by the alert would;
``cap_raises_after_stalls`` counts how often that was needed and ``stalls`` says what held the
memory each time (the consolidator acknowledges while full, so its pending count there is 0).
Prints the figures as JSON; exit status 1 if an accepted command was lost, doubled or
dead-lettered, or a consumer exited.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from pathlib import Path

import orjson
from harness import DEFAULT_DATABASE_URL, fresh_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from tests.faults.full_redis import run_full_redis
from tests.redis_process import RedisProcess
from worker.connections import redis_client
from worker.logs import configure_logging


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--sessions", type=int, default=5_000)
    parser.add_argument("--headroom-mb", type=float, default=4.0)
    parser.add_argument("--publishers", type=int, default=8)
    parser.add_argument(
        "--server",
        choices=("valkey", "redis"),
        default=None,
        help="valkey: the embedded valkey-server; redis: redis-server from PATH "
        "(default: valkey if installed)",
    )
    args = parser.parse_args()
    configure_logging("ERROR", False)  # the consumers warn on every refusal; the JSON is the point
    with tempfile.TemporaryDirectory() as data:
        server = RedisProcess(Path(data), persistent=False, server=args.server)
        server.start()
        try:
            async with fresh_database(args.database_url) as url:
                redis = redis_client(server.url)
                used = int((await redis.info("memory"))["used_memory"])
                await redis.aclose()
                report = await run_full_redis(
                    server.url,
                    url,
                    "soak" + uuid.uuid4().hex[:6],
                    maxmemory=used + int(args.headroom_mb * 2**20),
                    sessions=args.sessions,
                    publishers=args.publishers,
                )
        finally:
            server.stop()
    print(f"server: {server.binary}", file=sys.stderr)
    print(orjson.dumps(report.summary(), option=orjson.OPT_INDENT_2).decode())
    bad = report.missing or report.duplicated or report.dead_letters
    return 1 if bad or report.worker_exited or report.consolidator_exited else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
