"""What a batch INSERT of conversation turns costs Postgres, and where: the same 1,000-turn
``INSERT … SELECT FROM unnest(…)`` into tables that add, one at a time, what ``episodes`` has
(its columns, the generated ``search_vector``, the b-tree indexes, the GIN index), beside a
plain table and the product's own statement (``turns.insert_turns``: ``episodes`` and the
outbox rows of ``memory_changes``).

    .venv/bin/python bench/turn_insert_cost.py [--database-url URL] [--rounds 10] [--batch 1000]

Each round inserts one batch into every table, in turn (so the machine's load falls on all
alike), each in its own transaction, under ``EXPLAIN (ANALYZE, BUFFERS)``: "Postgres ms" is
its Execution Time (Postgres's own work on the rows, the commit not included), "wall ms" the
client's clock around the statement and its commit. A fresh migrated database of its own,
dropped at the end. The GIN index's pending list (``fastupdate``, on by default) defers part
of the GIN work to the insert that fills it past ``gin_pending_list_limit`` (4 MB), so read the
mean and the max, not only the median.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
from harness import DEFAULT_DATABASE_URL, fresh_database, invocation, markdown_table
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from user_memory import WORDS

from worker.db.engine import create_database_engine
from worker.db.models import TURN_OUTCOME
from worker.user_memory import turns
from worker.user_memory.models import Episode
from worker.user_memory.writes import remembered_events

OUTPUT = "done, confirmation sent by email"

_UNNEST = (
    " FROM unnest(CAST(:ids AS uuid[]), CAST(:srcs AS text[]), CAST(:us AS text[]),"
    " CAST(:ts AS text[]), CAST(:is AS text[]), CAST(:ats AS timestamptz[]))"
    " AS r(id, src, u, t, i, at)"
)
_PLAIN = (
    "INSERT INTO v_plain (id, project_id, user_id, turn_id, input, output, occurred_at)"
    " SELECT id, :p, u, t, i, :o, at" + _UNNEST
)
_EPISODE_COLUMNS = (
    " (id, source_event_id, project_id, session_id, user_id, turn_id, input, output,"
    " tool_calls, tool_transcript, outcome, lessons_learned, context_summary,"
    " importance_score, occurred_at) SELECT id, src, :p, 's', u, t, i, :o, '[]'::jsonb, NULL,"
    " :outcome, '[]'::jsonb, '', 0.5, at" + _UNNEST
)
_BTREES = (
    "ALTER TABLE {t} ADD PRIMARY KEY (id)",
    "CREATE UNIQUE INDEX ON {t} (source_event_id)",
    "CREATE UNIQUE INDEX ON {t} (project_id, turn_id, user_id) WHERE turn_id IS NOT NULL",
    "CREATE UNIQUE INDEX ON {t} (project_id, turn_id) WHERE turn_id IS NOT NULL"
    " AND user_id IS NULL",
    "CREATE INDEX ON {t} (project_id, occurred_at)",
    "CREATE INDEX ON {t} (project_id, user_id, occurred_at)",
)
_GIN = "CREATE INDEX ON {t} USING gin (search_vector)"
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "plain table (uuid key, 6 columns)": (
        "v_plain",
        [
            "CREATE TABLE v_plain (id uuid PRIMARY KEY, project_id text, user_id text,"
            " turn_id text, input text, output text, occurred_at timestamptz)"
        ],
    ),
    "`episodes`' columns, no index, no search vector": (
        "v_bare",
        [
            "CREATE TABLE v_bare (LIKE episodes INCLUDING DEFAULTS) WITH (fillfactor = 50)",
            "ALTER TABLE v_bare ALTER COLUMN search_vector DROP NOT NULL",
        ],
    ),
    "+ generated `search_vector` (tsvector)": (
        "v_words",
        [
            "CREATE TABLE v_words (LIKE episodes INCLUDING DEFAULTS INCLUDING GENERATED)"
            " WITH (fillfactor = 50)"
        ],
    ),
    "+ its b-tree indexes (key, 3 unique, 2 by time)": (
        "v_btrees",
        [
            "CREATE TABLE v_btrees (LIKE episodes INCLUDING DEFAULTS INCLUDING GENERATED)"
            " WITH (fillfactor = 50)",
            *(s.format(t="v_btrees") for s in _BTREES),
        ],
    ),
    "+ the GIN index (fastupdate on, the default): `episodes` as it is": (
        "v_full",
        [
            "CREATE TABLE v_full (LIKE episodes INCLUDING DEFAULTS INCLUDING GENERATED)"
            " WITH (fillfactor = 50)",
            *(s.format(t="v_full") for s in _BTREES),
            _GIN.format(t="v_full"),
        ],
    ),
    "the same, GIN fastupdate off": (
        "v_nofast",
        [
            "CREATE TABLE v_nofast (LIKE episodes INCLUDING DEFAULTS INCLUDING GENERATED)"
            " WITH (fillfactor = 50)",
            *(s.format(t="v_nofast") for s in _BTREES),
            _GIN.format(t="v_nofast") + " WITH (fastupdate = off)",
        ],
    ),
}
PRODUCT = "the product's statement (`insert_turns`: `episodes` + outbox rows)"


def batch(tag: str, size: int) -> list[Episode]:
    """``size`` turns like ``bench/user_memory_load.py``'s: 12 words of 32, 50 users."""
    out = []
    for k in range(size):
        words = " ".join(WORDS[(k * 7 + j * 13 + len(tag)) % len(WORDS)] for j in range(12))
        out.append(
            Episode(
                id=f"{tag}-{k}",
                session_id=f"s{k % 50}",
                user_id=f"u{k % 50}",
                input=f"please {words}",
                output=OUTPUT,
            )
        )
    return out


def parameters(project: str, episodes: list[Episode]) -> dict[str, Any]:
    sources = [turns.turn_source(project, e.user_id, e.id) for e in episodes]
    return {
        "ids": [turns.turn_uuid(project, e.user_id, e.id) for e in episodes],
        "srcs": sources,
        "us": [e.user_id for e in episodes],
        "ts": [e.id for e in episodes],
        "is": [e.input for e in episodes],
        "ats": [datetime.now(UTC)] * len(episodes),
        "p": project,
        "o": OUTPUT,
        "outcome": TURN_OUTCOME,
    }


async def explained(engine: AsyncEngine, statement: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run ``statement`` under EXPLAIN (ANALYZE, BUFFERS) in a transaction of its own."""
    started = time.perf_counter()
    async with engine.begin() as conn:
        plan = await conn.scalar(
            text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement), params
        )
    wall = time.perf_counter() - started
    top = (orjson.loads(plan) if isinstance(plan, str | bytes) else plan)[0]
    node = top["Plan"]
    return {
        "exec_ms": top["Execution Time"],
        "wall_ms": 1000 * wall,
        "hit": node.get("Shared Hit Blocks", 0),
        "dirtied": node.get("Shared Dirtied Blocks", 0),
        "written": node.get("Shared Written Blocks", 0),
    }


async def product(engine: AsyncEngine, project: str, episodes: list[Episode]) -> dict[str, Any]:
    """The product's statement (``turns.insert_turns``'s, the rows and their owed events) under
    EXPLAIN (ANALYZE, BUFFERS), with the parameters ``insert_turns`` gives it."""
    params = parameters(project, episodes)
    events = remembered_events(project, episodes)
    params |= {
        "ps": [project] * len(episodes),
        "ss": [e.session_id for e in episodes],
        "os": [e.output for e in episodes],
        "calls": ["[]"] * len(episodes),
        "transcripts": [None] * len(episodes),
        "events": [orjson.dumps(event).decode() for event in events],
    }
    return await explained(engine, turns._INSERT_MANY.text, params)


async def run(args: argparse.Namespace) -> str:
    load_before = os.getloadavg()[0]
    async with fresh_database(args.database_url) as url:
        engine = create_database_engine(url)
        try:
            async with engine.begin() as conn:
                for _name, (_table, ddl) in VARIANTS.items():
                    for statement in ddl:
                        await conn.execute(text(statement))
            samples: dict[str, list[dict[str, Any]]] = {n: [] for n in [*VARIANTS, PRODUCT]}
            for r in range(args.rounds + 1):  # round 0 warms up (plans, caches): not counted
                tag = f"r{r}-{uuid.uuid4().hex[:6]}"
                episodes = batch(tag, args.batch)
                params = parameters("cost", episodes)
                for name, (table, _ddl) in VARIANTS.items():
                    if table == "v_plain":
                        statement = _PLAIN
                    else:
                        statement = f"INSERT INTO {table}" + _EPISODE_COLUMNS
                    got = await explained(engine, statement, params)
                    if r:
                        samples[name].append(got)
                got = await product(engine, "cost", episodes)
                if r:
                    samples[PRODUCT].append(got)
        finally:
            await engine.dispose()
    rows = []
    plain_wall = statistics.mean(s["wall_ms"] for s in samples[next(iter(VARIANTS))])
    for name, runs in samples.items():
        exec_ms = [float(s["exec_ms"]) for s in runs]
        wall = [float(s["wall_ms"]) for s in runs]
        last = runs[-1]
        rows.append(
            [
                name,
                f"{statistics.median(exec_ms):,.1f}",
                f"{statistics.mean(exec_ms):,.1f}",
                f"{max(exec_ms):,.1f}",
                f"{statistics.median(wall):,.1f}",
                f"{statistics.mean(wall):,.1f}",
                f"{1000 * statistics.mean(wall) / args.batch:,.0f}",
                f"{args.batch * 1000 / statistics.mean(wall):,.0f}/s",
                f"{statistics.mean(wall) / plain_wall:.2f}",
                f"{last['hit']:,} / {last['dirtied']:,}",
            ]
        )
    header = [
        "table the batch goes into",
        "Postgres ms p50",
        "Postgres ms mean",
        "Postgres ms max",
        "wall ms p50",
        "wall ms mean",
        "µs a turn",
        "turns/s (one client)",
        "× plain",
        "buffers hit / dirtied (last)",
    ]
    return (
        f"`{invocation()}` — {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; {args.rounds} rounds of {args.batch:,} turns a table; load "
        f"average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n\n"
        + markdown_table(header, rows, "lrrrrrrrrr")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1_000)
    print(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
