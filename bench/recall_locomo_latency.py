"""``recall_scored``'s latency over LoCoMo's tuning questions, two commits in the same run, on the
same database.

    python bench/recall_locomo_latency.py --data PATH/TO/locomo10.json [--after COMMIT] \\
        [--before COMMIT] [--rounds 2] [--analyze] [--pgvector-url URL] [--redis-url URL]

The turns of the split (``bench/recall_locomo.py``'s ingestion: one user per conversation, one
episode per turn) are remembered and embedded once, by this checkout. Then, ``--rounds`` times,
each version in turn (``--after``, default ``HEAD``, then ``--before``, default ``main``, each
checked out in a temporary git worktree) runs in a process of its own: it loads the embedder,
warms up with one question per conversation, and times ``recall_scored(question,
user_id=<conversation>, limit=10)`` for every question of categories 1-4, one after another.
p50 and p99 per version and round: the machine's load changes between rounds, so compare the
versions within a round. ``--analyze``: ``ANALYZE`` the database after the import (what
autovacuum does within its first minute): without it, the first process plans on tables that
have no statistics yet, and its round is the slow one (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import earlier_checkout, fresh_database, invocation, markdown_table, percentile
from recall_common import pgvector_server
from recall_locomo import LIMIT, PROJECT, Conversation, ingest, load, redis_server
from sqlalchemy import text

from worker.episodes.embedding import LocalEmbedder
from worker.episodes.vectorising import reindex
from worker.settings import Settings
from worker.user_memory.memory import Memory

TIMER = """
import asyncio, json, sys, time
from worker.episodes.embedding import LocalEmbedder
from worker.settings import Settings
from worker.user_memory.memory import Memory

async def main(redis_url, database_url, questions_path, project, limit):
    limit = int(limit)
    questions = json.loads(open(questions_path).read())
    embedder = LocalEmbedder()
    embedder.load()
    settings = Settings(redis_url=redis_url, database_url=database_url, stream_prefix="locomo")
    seconds = []
    async with Memory(project, settings=settings, embedder=embedder) as memory:
        seen = set()
        for user, question in questions:  # warm-up: one question per conversation
            if user not in seen:
                seen.add(user)
                await memory.recall_scored(question, user_id=user, limit=limit)
        for user, question in questions:
            started = time.perf_counter()
            await memory.recall_scored(question, user_id=user, limit=limit)
            seconds.append(time.perf_counter() - started)
    print(json.dumps(seconds))

asyncio.run(main(*sys.argv[1:]))
"""


def timed(tree: Path, redis_url: str, database_url: str, questions: Path) -> list[float]:
    """The latencies measured by a process running the worker of ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", TIMER, redis_url, database_url, str(questions), PROJECT, str(LIMIT)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return [float(s) for s in json.loads(done.stdout.strip().splitlines()[-1])]


async def prepare(
    url: str, redis_url: str, conversations: list[Conversation], analyze: bool = False
) -> None:
    embedder = LocalEmbedder()
    embedder.load()
    settings = Settings(redis_url=redis_url, database_url=url, stream_prefix="locomo")
    async with Memory(PROJECT, settings=settings, embedder=embedder) as memory:
        for conv in conversations:
            await ingest(memory, conv)
        await reindex(memory.engine, embedder, project_id=PROJECT)
        if analyze:
            async with memory.engine.connect() as conn:
                await conn.execute(text("ANALYZE"))
                await conn.commit()


async def run(args: argparse.Namespace) -> str:
    rows: list[list[str]] = []
    conversations = load(Path(args.data), "tuning")
    with (
        redis_server(args.redis_url) as redis_url,
        pgvector_server(args.pgvector_url) as pg,
        tempfile.TemporaryDirectory(prefix="memworker-latency-") as tmp,
    ):
        questions = Path(tmp) / "questions.json"
        asked = [[c.sample_id, q.text] for c in conversations for q in c.questions]
        questions.write_text(json.dumps(asked))
        async with fresh_database(pg) as url:
            await prepare(url, redis_url, conversations, args.analyze)
            with earlier_checkout(args.after) as after, earlier_checkout(args.before) as before:
                for n in range(1, args.rounds + 1):
                    for name, tree in ((args.after, after), (args.before, before)):
                        load_before = os.getloadavg()[0]
                        started = time.perf_counter()
                        seconds = await asyncio.to_thread(timed, tree, redis_url, url, questions)
                        rows.append(
                            [
                                str(n),
                                name,
                                str(len(seconds)),
                                f"{percentile(seconds, 50) * 1000:.1f}",
                                f"{percentile(seconds, 99) * 1000:.1f}",
                                f"{load_before:.1f}",
                                f"{time.perf_counter() - started:.0f}",
                            ]
                        )
    header = ["round", "code", "recalls", "p50 ms", "p99 ms", "load before", "run s"]
    return f"`{invocation()}`\n\n" + markdown_table(header, rows, "llrrrrr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="LoCoMo's locomo10.json")
    parser.add_argument("--before", default="main", help="the earlier commit (default main)")
    parser.add_argument("--after", default="HEAD", help="the later commit (default HEAD)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--analyze", action="store_true", help="ANALYZE after the import")
    parser.add_argument("--redis-url", help="default: an embedded Valkey for the run")
    parser.add_argument("--pgvector-url", help="default: an embedded PostgreSQL for the run")
    print(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
