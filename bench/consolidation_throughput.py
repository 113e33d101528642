"""Consolidation throughput: the batched Consolidator next to a naive per-row-commit loop, and
where its CPU goes.

    python bench/consolidation_throughput.py --redis-url redis://127.0.0.1:6379/0 \\
        --database-url postgresql://postgres@127.0.0.1:5432/postgres --episodes 20000

Every result is an ``agent.terminated`` with ``consolidate: true`` and a realistic snapshot
(20 variables, 30 scratchpad steps, a task state, checkpoints), so every entry becomes an
episode row and a lifecycle event row. Each run drains a prefilled results stream into a fresh
database (created, migrated, dropped) under its own stream prefix.

Rounds alternate two schemas, so both see the same machine:

- **product**: the migrated schema, as `memworker migrate` makes it.
- **floor**: the same with the full-text search vector and the two secondary indexes dropped.
  Not a configuration anyone should run: it shows what the rest of the work costs, i.e. how
  fast consolidation could be if search were free.

Besides episodes/s, each run records the CPU time spent per episode by this process (the
consolidator: reading, parsing, summarising, encoding), by every Postgres process on this
machine (backends, WAL writer, checkpointer; only when the database is local) and by Redis
(``INFO cpu``). With C cores, no implementation of the same work can exceed
C × 1,000,000 / (total µs per episode) episodes/s: the "ceiling" column.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import psutil
from harness import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    cancel_on_sigterm,
    cleanup,
    fresh_database,
    markdown_table,
)
from redis.asyncio import Redis
from sqlalchemy import make_url, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.codec import decode_entry
from worker.connections import redis_client
from worker.consolidation.consolidator import Consolidator
from worker.consolidation.results import ParsedResult, episode_row, event_row, parse_result
from worker.consumers.loop import StreamEntry
from worker.db.engine import create_database_engine
from worker.db.models import Episode, LifecycleEvent
from worker.keys import CONSOLIDATION_GROUP, StreamKeys
from worker.settings import Settings

FLOOR_SCHEMA = (
    "ALTER TABLE episodes DROP COLUMN search_vector",  # and its GIN index
    "DROP INDEX ix_episodes_project_id_occurred_at",
    "DROP INDEX ix_lifecycle_events_project_id_session_id_occurred_at",
)
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", None, ""}


def terminated_result(i: int) -> dict[str, Any]:
    stamp = f"2025-01-01T00:{(i // 60) % 60:02d}:{i % 60:02d}Z"
    return {
        "event_id": f"r-{uuid.uuid4().hex}",
        "type": "agent.terminated",
        "causation_id": uuid.uuid4().hex,
        "command": "terminate",
        "project_id": f"proj-{i % 10}",
        "session_id": f"sess-{i}",
        "agent_instance_id": f"agent-{i}",
        "agent_type_id": "researcher",
        "seq": 7,
        "correlation_id": None,
        "metadata": {"run": "bench"},
        "occurred_at": stamp,
        "duration_ms": 0.8,
        "outcome": "success" if i % 4 else "failure",
        "items_cleared": 52,
        "consolidate": True,
        "task_description": f"Summarise quarterly report {i} and flag anomalies in the totals",
        "lessons_learned": ["check currency units first", "totals lag the detail by a day"],
        "tokens_used": 12_000 + i,
        "importance": 0.6,
        "started_at": "2025-01-01T00:00:00Z",
        "duration_seconds": 95.5,
        "life": uuid.uuid4().hex[:16],  # the life that ended (apply_command.lua's terminate)
        "snapshot": {
            "variables": {f"var_{k}": {"value": k, "text": "lorem ipsum " * 4} for k in range(20)},
            "task_state": {
                "description": "reading sources",
                "current_step": 4,
                "total_steps": 6,
                "status": "in_progress",
                "progress": 66.0,
                "started_at": "2025-01-01T00:00:00Z",
                "updated_at": stamp,
                "data": {"sources": 12},
            },
            "scratchpad": [
                {"content": f"step {k}: read source {k}, found nothing odd", "timestamp": stamp}
                for k in range(30)
            ],
            "checkpoints": ["cp-1", "cp-2"],
        },
    }


async def prefill(redis: Redis, stream: str, count: int, first: int = 0) -> None:
    await redis.xgroup_create(stream, CONSOLIDATION_GROUP, id="0", mkstream=True)
    pipe = redis.pipeline(transaction=False)
    for i in range(first, first + count):
        pipe.xadd(stream, {"data": orjson.dumps(terminated_result(i))})
        if i % 1000 == 999:
            await pipe.execute()
    await pipe.execute()


async def naive(settings: Settings, redis: Redis, engine: AsyncEngine, stream: str) -> int:
    """One entry at a time: read, parse, INSERT both rows, COMMIT, XACK."""
    done = 0
    while True:
        reply: Any = await redis.xreadgroup(CONSOLIDATION_GROUP, "naive", {stream: ">"}, count=1)
        if not reply:
            return done
        entry_id, fields = reply[0][1][0]
        entry = StreamEntry(stream, entry_id.decode(), {k.decode(): v for k, v in fields.items()})
        payload = decode_entry(entry.fields)
        parsed = ParsedResult(entry, payload, parse_result(payload))
        async with engine.begin() as conn:
            await conn.execute(insert(LifecycleEvent).on_conflict_do_nothing(), [event_row(parsed)])
            await conn.execute(
                insert(Episode).on_conflict_do_nothing(),
                [episode_row(parsed, settings.context_summary_max_chars)],
            )
        await redis.xack(stream, CONSOLIDATION_GROUP, entry.entry_id)
        done += 1


def postgres_cpu_seconds() -> float:
    """CPU time of every process named ``postgres*`` on this machine, so far."""
    total = 0.0
    for proc in psutil.process_iter(["name"]):
        name = proc.info["name"] or ""
        if name.startswith("postgres"):
            try:
                times = proc.cpu_times()
            except psutil.Error:  # gone meanwhile: a backend that ended
                continue
            total += times.user + times.system
    return total


async def redis_cpu_seconds(redis: Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass
class Run:
    label: str
    episodes: int
    seconds: float
    python_s: float
    postgres_s: float | None
    redis_s: float

    @property
    def rate(self) -> float:
        return self.episodes / self.seconds


async def measured(
    label: str, redis: Redis, local_postgres: bool, drain: Callable[[], Awaitable[int]]
) -> Run:
    """Run ``drain`` and what it cost each process (see the module docstring)."""
    redis_before = await redis_cpu_seconds(redis)
    postgres_before = postgres_cpu_seconds() if local_postgres else 0.0
    python_before = time.process_time()
    started = time.perf_counter()
    episodes = await drain()
    seconds = time.perf_counter() - started
    python_s = time.process_time() - python_before
    postgres_s = postgres_cpu_seconds() - postgres_before if local_postgres else None
    redis_s = await redis_cpu_seconds(redis) - redis_before
    return Run(label, episodes, seconds, python_s, postgres_s, redis_s)


Kind = Literal["product", "floor", "naive"]
LABELS: dict[Kind, str] = {
    "product": "Consolidator (batch {batch})",
    "floor": "floor: no search vector, no secondary indexes",
    "naive": "naive: one COMMIT + XACK per entry",
}


async def one_run(args: argparse.Namespace, redis: Redis, local_postgres: bool, kind: Kind) -> Run:
    async with fresh_database(args.database_url) as url:
        prefix = "bench" + uuid.uuid4().hex[:8]
        settings = Settings(
            redis_url=args.redis_url,
            database_url=url,
            stream_prefix=prefix,
            consolidation_batch_size=args.batch_size,
        )
        engine = create_database_engine(url)
        try:
            if kind == "floor":
                async with engine.begin() as conn:
                    for statement in FLOOR_SCHEMA:
                        await conn.execute(text(statement))
            stream = StreamKeys(prefix, 0).results
            count = args.naive_episodes if kind == "naive" else args.episodes
            await prefill(redis, stream, count)
            drain: Callable[[], Awaitable[int]] = (
                (lambda: naive(settings, redis, engine, stream))
                if kind == "naive"
                else Consolidator(settings, redis, engine).run_once
            )
            label = LABELS[kind].format(batch=args.batch_size)
            run = await measured(label, redis, local_postgres, drain)
            async with engine.connect() as conn:
                stored = (await conn.execute(text("SELECT count(*) FROM episodes"))).scalar_one()
            assert stored == count == run.episodes, (stored, count, run.episodes)
            return run
        finally:
            await engine.dispose()
            await cleanup(redis, prefix)


def summary_row(runs: list[Run], cores: int) -> list[object]:
    """Median rate (min–max over rounds) and median CPU per episode of one implementation."""
    rates = [r.rate for r in runs]

    def median_micros(pick: Callable[[Run], float | None]) -> float | None:
        per_episode: list[float] = []
        for run in runs:
            seconds = pick(run)
            if seconds is None:
                return None
            per_episode.append(seconds / run.episodes * 1e6)
        return statistics.median(per_episode)

    python = median_micros(lambda r: r.python_s)
    postgres = median_micros(lambda r: r.postgres_s)
    redis = median_micros(lambda r: r.redis_s)
    total = (
        None if python is None or postgres is None or redis is None else python + postgres + redis
    )
    ceiling = cores * 1e6 / total if total else None
    spread = f"{min(rates):,.0f}–{max(rates):,.0f}" if len(runs) > 1 else "–"
    figures = [python, postgres, redis, total, ceiling]
    return [
        runs[0].label,
        f"{runs[0].episodes:,}",
        len(runs),
        f"**{statistics.median(rates):,.0f}**",
        spread,
        *("n/a" if value is None else f"{value:,.0f}" for value in figures),
    ]


async def main() -> None:
    cancel_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--episodes", type=int, default=20_000)
    parser.add_argument("--naive-episodes", type=int, default=1_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each schema, alternating")
    args = parser.parse_args()

    cores = os.cpu_count() or 1
    local_postgres = make_url(args.database_url).host in LOCAL_HOSTS
    redis = redis_client(args.redis_url)  # as the consolidator gets it in production
    try:
        product: list[Run] = []
        floor: list[Run] = []
        for _ in range(args.rounds):
            product.append(await one_run(args, redis, local_postgres, "product"))
            floor.append(await one_run(args, redis, local_postgres, "floor"))
        slow = await one_run(args, redis, local_postgres, "naive")
    finally:
        await redis.aclose()

    print(
        f"{args.episodes:,} terminated results with snapshots per run ({args.naive_episodes:,}"
        f" for the naive loop); {args.rounds} rounds alternating the product and floor schemas;"
        f" {cores} CPUs. Episodes/s is the median over rounds (min–max beside it); CPU is"
        " µs per episode, median over rounds; ceiling = CPUs × 10⁶ ÷ total CPU µs.\n"
    )
    header = [
        "implementation",
        "episodes",
        "runs",
        "episodes/s",
        "range",
        "consolidator CPU",
        "Postgres CPU",
        "Redis CPU",
        "total CPU",
        "ceiling/s",
    ]
    rows = [summary_row(product, cores), summary_row(floor, cores), summary_row([slow], cores)]
    print(markdown_table(header, rows, "lrrrrrrrrr"))
    batched = statistics.median(r.rate for r in product)
    print(f"\nbatched / naive: **{batched / slow.rate:.1f}×**")


if __name__ == "__main__":
    asyncio.run(main())
