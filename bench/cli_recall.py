"""`memworker recall` wall time, process start included (issue 25: at most 1.5 s).

Starts the embedded PostgreSQL with pgvector (``tests.pgvector_server``), stores and indexes the
labeled recall set, then runs ``memworker recall`` as a new process ``--runs`` times and prints
each wall time and the median, and whether the process imported torch (it must not: the local
embedder runs the int8 ONNX file). Redis: ``--redis-url`` (its own key prefix, deleted after).

    .venv/bin/python bench/cli_recall.py --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from redis.asyncio import Redis
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.pgvector_server import pgvector_server
from tests.recall_set import load_recall_set, remember_all
from worker.db.engine import create_database_engine
from worker.db.migrate import migrate
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


async def measure(redis_url: str, runs: int) -> None:
    with pgvector_server() as admin_url:
        admin_url = Settings(database_url=admin_url).database_url
        name = "clirecall" + uuid.uuid4().hex[:8]
        admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        prefix = "clirecall" + uuid.uuid4().hex[:8]
        settings = Settings(database_url=url, redis_url=redis_url, stream_prefix=prefix)
        redis = Redis.from_url(redis_url)
        engine = create_database_engine(url)
        try:
            await migrate(url)
            episodes, _queries = load_recall_set()
            await remember_all(engine, redis, prefix, "acme", episodes)
            await Indexer(settings, redis, engine, LocalEmbedder()).run_once()
            env = {
                **os.environ,
                "MEMWORKER_DATABASE_URL": url,
                "MEMWORKER_REDIS_URL": redis_url,
                "MEMWORKER_STREAM_PREFIX": prefix,
            }
            command = [sys.executable, "-m", "worker.cli", "recall", "-p", "acme"]
            walls = []
            for _ in range(runs):
                started = time.perf_counter()
                done = subprocess.run(
                    [*command, "users cannot sign in", "--limit", "3"],
                    env=env,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                walls.append(time.perf_counter() - started)
                if done.returncode != 0:
                    raise SystemExit(done.stderr)
            imports = subprocess.run(
                [sys.executable, "-X", "importtime", *command[1:], "sign in"],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            ).stderr
            print(f"memworker recall wall time (s): {[round(w, 2) for w in walls]}")
            print(f"median {statistics.median(walls):.2f} s, max {max(walls):.2f} s")
            print(f"torch imported: {' torch' in imports}")
        finally:
            async for key in redis.scan_iter(match=f"{prefix}:*"):
                await redis.delete(key)
            await redis.aclose()
            await engine.dispose()
            async with admin.connect() as conn:
                await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            await admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    asyncio.run(measure(args.redis_url, args.runs))


if __name__ == "__main__":
    main()
