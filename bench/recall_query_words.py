"""What a recall costs as its query grows: one user with ``--turns`` turns (words from the
load bench's vocabulary plus random ones, so a long query can match many distinct words),
recalled by words (``alpha=0``) with queries of 8 to ``--max-words`` distinct words that the
turns hold, ``--runs`` times each; the median and worst per query size. A database of its own
(dropped at the end), no pgvector needed.

    PYTHONPATH=. .venv/bin/python bench/recall_query_words.py [--database-url URL] \\
        [--redis-url URL] [--turns 1000] [--max-words 4000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import string
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from harness import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, fresh_database, unique_prefix
from sqlalchemy import text

from worker.settings import Settings
from worker.user_memory.memory import Memory

USER = "long-query-user"


def vocabulary(size: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(7)) for _ in range(size)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--max-words", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    words = vocabulary(args.max_words)
    async with fresh_database(args.database_url) as url:
        settings = Settings(
            redis_url=args.redis_url,
            database_url=url,
            stream_prefix=unique_prefix("recallwords"),
            remember_embedding="indexer",
        )
        memory = Memory(project_id="bench", settings=settings)
        try:
            async with memory.engine.begin() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO episodes (id, source_event_id, project_id, session_id,"
                        " user_id, turn_id, input, output, outcome, lessons_learned,"
                        " context_summary, importance_score, occurred_at, announced_at)"
                        " SELECT gen_random_uuid(), 'turn:bench@' || :u || '/t' || i, 'bench',"
                        " 's' || (i / 20), :u, 't' || i,"
                        " array_to_string(array(SELECT (CAST(:w AS text[]))"
                        "   [1 + floor(random() * :n)::int] FROM generate_series(1, 120)"
                        "   WHERE i > 0), ' '),"
                        " array_to_string(array(SELECT (CAST(:w AS text[]))"
                        "   [1 + floor(random() * :n)::int] FROM generate_series(1, 120)"
                        "   WHERE i > 0), ' '),"
                        " 'turn', '[]'::jsonb, '', 0.5, now() - i * interval '1 minute', now()"
                        " FROM generate_series(1, :count) AS i"
                    ),
                    {"u": USER, "w": words, "n": len(words), "count": args.turns},
                )
                await conn.execute(text("ANALYZE episodes"))
            print(
                f"{args.turns} turns of 240 words from {len(words)}; load {os.getloadavg()[0]:.1f}"
            )
            print("| distinct query words | bytes | median ms | worst ms |")
            print("| ---: | ---: | ---: | ---: |")
            sizes = [8 * 4**k for k in range(10) if 8 * 4**k < args.max_words]
            for size in [*sizes, args.max_words]:
                query = " ".join(words[:size])
                times = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    await memory.recall_scored(query, user_id=USER, limit=5, alpha=0.0)
                    times.append((time.perf_counter() - start) * 1000)
                print(
                    f"| {size} | {len(query.encode())} | {statistics.median(times):.0f}"
                    f" | {max(times):.0f} |",
                    flush=True,
                )
        finally:
            await memory.close()


if __name__ == "__main__":
    asyncio.run(main())
