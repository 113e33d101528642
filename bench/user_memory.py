"""User memory (``worker.Memory``): blocks, remember, recall, facts, and the change feed's Redis
cost, against a migrated Postgres (a database of its own, dropped at the end) and Redis.

    .venv/bin/python bench/user_memory.py [--redis-url URL] [--database-url URL | --pgvector] \\
        [--users 1000] [--ops 5000] [--remembers 2000] [--episodes 10000] [--facts 10000]

- ``working()``: ``--users`` users with 5 pinned blocks of ~500 bytes each (loaded in SQL),
  ``--ops`` sequential calls for a random user;
- ``update_block``: one write per user (a real call: its ``block.updated`` goes out on the feed);
- ``remember``: ``--remembers`` sequential turns (latency), then as many from 8 tasks at once
  (throughput), in the same run with an indexer to embed them
  (``MEMWORKER_REMEMBER_EMBEDDING=indexer``: ``remember`` only stores and announces) and with
  none (``inline``: ``remember`` embeds the turn before it returns; the local model, its load
  not timed), each on its own project;
- ``recall_scored`` over one user's ``--episodes`` turns (loaded in SQL), 3 words of their
  vocabulary per query, limit 5: **words only** when the server has no pgvector;
- ``recall_facts`` over one user's ``--facts`` facts (loaded in SQL), by words, limit 5;
- the change feed: ``MEMORY USAGE`` of the project's ``P:changes:{i}`` ÷ its entries, and Redis
  CPU per XADD (``INFO commandstats`` before/after the block writes, which XADD once each and
  do nothing else in Redis; the server is shared, so the XADDs counted are shown beside the
  expected ones).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from harness import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    cancel_on_sigterm,
    cleanup,
    fresh_database,
    markdown_table,
    percentile,
    unique_prefix,
)
from recall_common import pgvector_server
from redis.asyncio import Redis
from sqlalchemy import text

from worker.db.vectors import has_vector_table
from worker.keys import changes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

PROJECT = "bench"
BLOCKS = 5
BLOCK_BYTES = 500
WARM_TURNS = 50
WORDS = [
    "invoice",
    "refund",
    "shipping",
    "parcel",
    "delay",
    "warehouse",
    "customer",
    "address",
    "payment",
    "card",
    "bank",
    "transfer",
    "flight",
    "hotel",
    "booking",
    "lisbon",
    "porto",
    "train",
    "ticket",
    "seat",
    "window",
    "aisle",
    "meal",
    "vegan",
    "allergy",
    "doctor",
    "appointment",
    "monday",
    "tuesday",
    "report",
    "quarterly",
    "sales",
    "forecast",
    "budget",
    "team",
    "meeting",
    "agenda",
    "notes",
    "summary",
    "draft",
    "email",
    "reply",
    "urgent",
    "contract",
    "renewal",
    "price",
    "discount",
]


async def timed(op: Callable[[int], Awaitable[object]], count: int, warmup: int) -> list[float]:
    """Seconds of each of ``count`` sequential awaits of ``op(i)``, after ``warmup``."""
    for i in range(warmup):
        await op(i)
    samples = []
    clock = time.perf_counter
    for i in range(count):
        start = clock()
        await op(i)
        samples.append(clock() - start)
    return samples


def ms(samples: list[float], q: float) -> str:
    return f"{percentile(samples, q) * 1000:,.2f} ms"


async def xadd_stats(redis: Redis) -> tuple[int, int]:
    stats: Any = await redis.info("commandstats")
    row = stats.get("cmdstat_xadd", {})
    return int(row.get("calls", 0)), int(row.get("usec", 0))


async def load_blocks(memory: Memory, users: int) -> None:
    async with memory.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO memory_blocks (project_id, user_key, name, content, pinned_order)"
                " SELECT :p, 'u' || u, 'block' || b, repeat(md5(u || '/' || b), :r), b"
                " FROM generate_series(0, :users - 1) AS u, generate_series(0, :blocks - 1) AS b"
            ),
            {"p": PROJECT, "r": BLOCK_BYTES // 32, "users": users, "blocks": BLOCKS},
        )
        await conn.execute(text("ANALYZE memory_blocks"))


async def load_turns(memory: Memory, user: str, count: int) -> None:
    async with memory.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO episodes (id, source_event_id, project_id, session_id, user_id,"
                " turn_id, input, output, outcome, lessons_learned, context_summary,"
                " importance_score, occurred_at, announced_at)"
                " SELECT gen_random_uuid(), 'turn:' || :p || '@' || :u || '/syn-' || i, :p,"
                " 's' || (i / 20), :u, 'syn-' || i,"
                " array_to_string(array(SELECT (CAST(:words AS text[]))"
                "   [1 + floor(random() * :n)::int] FROM generate_series(1, 12) WHERE i > 0), ' '),"
                " array_to_string(array(SELECT (CAST(:words AS text[]))"
                "   [1 + floor(random() * :n)::int] FROM generate_series(1, 20) WHERE i > 0), ' '),"
                " 'turn', '[]'::jsonb, '', 0.5, now() - i * interval '1 minute', now()"
                " FROM generate_series(1, :count) AS i"
            ),
            {"p": PROJECT, "u": user, "words": list(WORDS), "n": len(WORDS), "count": count},
        )
        await conn.execute(text("ANALYZE episodes"))


async def load_facts(memory: Memory, user: str, count: int) -> None:
    async with memory.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO facts (project_id, id, user_id, subject, predicate, object,"
                " confidence, valid_from, recorded_at)"
                " SELECT :p, 'fact_syn' || i, :u, 'user',"
                " 'pref_' || (CAST(:words AS text[]))[1 + i % :n] || '_' || i,"
                " array_to_string(array(SELECT (CAST(:words AS text[]))"
                "   [1 + floor(random() * :n)::int] FROM generate_series(1, 6) WHERE i > 0), ' '),"
                " 0.9, now() - i * interval '1 minute', now() - i * interval '1 minute'"
                " FROM generate_series(1, :count) AS i"
            ),
            {"p": PROJECT, "u": user, "words": list(WORDS), "n": len(WORDS), "count": count},
        )
        await conn.execute(text("ANALYZE facts"))


def query_words(rng: random.Random) -> str:
    return " ".join(rng.sample(WORDS, 3))


async def run(args: argparse.Namespace) -> str:
    cancel_on_sigterm()
    prefix = unique_prefix("user-memory")
    redis = Redis.from_url(args.redis_url)
    rng = random.Random(7)
    rows: list[list[str]] = []
    try:
        async with fresh_database(args.database_url) as url:
            settings = Settings(
                redis_url=args.redis_url,
                database_url=url,
                stream_prefix=prefix,
                remember_embedding="indexer",
            )
            async with Memory(PROJECT, settings=settings) as memory:
                async with memory.engine.connect() as conn:
                    vectors = await has_vector_table(conn)
                stream = changes_stream(prefix, PROJECT, settings.shards)

                await load_blocks(memory, args.users)
                working = await timed(
                    lambda i: memory.working(user_id=f"u{rng.randrange(args.users)}"),
                    args.ops,
                    200,
                )
                sample = await memory.working(user_id="u0")
                assert len(sample) == BLOCKS and len(sample[0].content) == BLOCK_BYTES - 20
                rows.append(
                    [
                        f"`working()` ({args.users:,} users × {BLOCKS} blocks of ~{BLOCK_BYTES} B)",
                        f"{args.ops:,}",
                        ms(working, 50),
                        ms(working, 99),
                        "",
                    ]
                )

                calls0, usec0 = await xadd_stats(redis)
                started = time.perf_counter()
                written = await timed(
                    lambda i: memory.update_block(
                        "block0", "y" * BLOCK_BYTES, user_id=f"u{i % args.users}"
                    ),
                    args.users,
                    0,
                )
                block_s = time.perf_counter() - started
                calls1, usec1 = await xadd_stats(redis)
                rows.append(
                    [
                        "`update_block` (one `block.updated` each)",
                        f"{args.users:,}",
                        ms(written, 50),
                        ms(written, 99),
                        f"{args.users / block_s:,.0f}/s",
                    ]
                )

                turn = "please book the vegan meal and a window seat on the lisbon flight"

                def episode(i: int, tag: str) -> Episode:
                    return Episode(
                        id=f"{tag}{i}",
                        session_id=f"live{i // 20}",
                        user_id=f"u{i % args.users}",
                        input=turn,
                        output="done: seat 14A, vegan meal requested",
                    )

                for i in range(WARM_TURNS):
                    await memory.remember(episode(i, "warm"))
                remembered = await timed(
                    lambda i: memory.remember(episode(i, "seq")), args.remembers, 0
                )
                seq_rate = args.remembers / sum(remembered)
                concurrency = 8
                started = time.perf_counter()

                async def writer(k: int) -> None:
                    for i in range(k, args.remembers, concurrency):
                        await memory.remember(episode(i, "par"))

                await asyncio.gather(*(writer(k) for k in range(concurrency)))
                par_rate = args.remembers / (time.perf_counter() - started)
                rows.append(
                    [
                        "`remember` (one turn; sequential / 8 tasks at once), an indexer embeds",
                        f"{args.remembers:,}",
                        ms(remembered, 50),
                        ms(remembered, 99),
                        f"{seq_rate:,.0f}/s / {par_rate:,.0f}/s",
                    ]
                )
                remember_row = len(rows)

                await load_turns(memory, "big", args.episodes)
                recalled = await timed(
                    lambda i: memory.recall_scored(query_words(rng), user_id="big", limit=5),
                    args.queries,
                    20,
                )
                found = await memory.recall_scored(query_words(rng), user_id="big", limit=5)
                assert len(found) == 5 and all(m.bm25_score for m in found)
                how = "words and meaning"
                if not vectors:
                    how = "words only: no pgvector on this server"
                elif found.unindexed:
                    how = "words only: these turns have no vectors"
                rows.append(
                    [
                        f"`recall_scored` over one user's {args.episodes:,} turns, limit 5 ({how})",
                        f"{args.queries:,}",
                        ms(recalled, 50),
                        ms(recalled, 99),
                        "",
                    ]
                )

                await load_facts(memory, "big", args.facts)
                facts = await timed(
                    lambda i: memory.recall_facts(query_words(rng), user_id="big", limit=5),
                    args.queries,
                    20,
                )
                assert len(await memory.recall_facts("vegan meal", user_id="big")) == 5
                rows.append(
                    [
                        f"`recall_facts` over one user's {args.facts:,} facts, limit 5 (words)",
                        f"{args.queries:,}",
                        ms(facts, 50),
                        ms(facts, 99),
                        "",
                    ]
                )

                await memory.flush_changes()
                entries = int(await redis.xlen(stream))
                usage = int(await redis.memory_usage(stream, samples=0) or 0)
                # block writes, the warm-up turns and the two remember phases
                expected = args.users + WARM_TURNS + 2 * args.remembers
                xadds, usec = calls1 - calls0, usec1 - usec0
            if vectors:  # its feed events are not counted above (one stream for all projects)
                inline = await remember_inline(settings, episode, args.remembers)
                rows.insert(remember_row, inline)
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()

    feed = [
        [
            "bytes per change event in `P:changes:{i}` (`MEMORY USAGE` ÷ entries)",
            f"{usage / max(1, entries):,.0f} B ({entries:,} entries, {usage / 1e6:,.2f} MB)",
        ],
        [
            "Redis CPU per XADD (`INFO commandstats`, during the block writes)",
            f"{usec / max(1, xadds):,.1f} µs ({xadds:,} XADDs counted, {args.users:,} expected)",
        ],
        ["Redis keys of blocks", "none: blocks live in Postgres; each write is one event"],
    ]
    assert entries == expected, (entries, expected)
    lines = [
        f"Python {platform.python_version()} · {os.cpu_count()} CPUs · Redis {args.redis_url} · "
        f"Postgres of {args.database_url.rsplit('@', 1)[-1]} (own database, "
        f"{'with' if vectors else 'without'} pgvector) · one `Memory`, calls one at a time "
        "unless said",
        "",
        markdown_table(["operation", "calls", "p50", "p99", "throughput"], rows, "lrrrr"),
        "",
        markdown_table(["change feed", "cost"], feed, "lr"),
    ]
    return "\n".join(lines)


async def remember_inline(
    settings: Settings, episode: Callable[[int, str], Episode], count: int
) -> list[str]:
    """The ``remember`` row again with no indexer: each turn embedded before it returns
    (``MEMWORKER_REMEMBER_EMBEDDING=inline``), on a project of its own."""
    inline = settings.model_copy(update={"remember_embedding": "inline"})
    async with Memory(f"{PROJECT}-inline", settings=inline) as memory:
        for i in range(WARM_TURNS):  # loads the model
            await memory.remember(episode(i, "warm"))
        remembered = await timed(lambda i: memory.remember(episode(i, "seq")), count, 0)
        seq_rate = count / sum(remembered)
        concurrency = 8
        started = time.perf_counter()

        async def writer(k: int) -> None:
            for i in range(k, count, concurrency):
                await memory.remember(episode(i, "par"))

        await asyncio.gather(*(writer(k) for k in range(concurrency)))
        par_rate = count / (time.perf_counter() - started)
        async with memory.engine.connect() as conn:
            embedded = (
                await conn.execute(
                    text("SELECT count(*) FROM episode_embeddings WHERE project_id = :p"),
                    {"p": memory.project_id},
                )
            ).scalar_one()
        assert embedded == WARM_TURNS + 2 * count, embedded
    return [
        "`remember`, no indexer: embedded before it returns (local model)",
        f"{count:,}",
        ms(remembered, 50),
        ms(remembered, 99),
        f"{seq_rate:,.0f}/s / {par_rate:,.0f}/s",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--ops", type=int, default=5_000)
    parser.add_argument("--remembers", type=int, default=2_000)
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--facts", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument(
        "--pgvector",
        action="store_true",
        help="on an embedded PostgreSQL with pgvector (not --database-url): recall by meaning,"
        " and remember with and without an indexer",
    )
    args = parser.parse_args()
    if not args.pgvector:
        print(asyncio.run(run(args)))
        return
    with pgvector_server(None) as url:
        args.database_url = url
        print(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
