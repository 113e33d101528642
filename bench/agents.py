"""Working memory under many concurrent agents: ops/s and latency, against raw redis-py.

    .venv/bin/python bench/agents.py [--redis-url URL] [--agents 100] [--seconds 10]

``--agents`` asyncio tasks, each with its own session (``WorkingMemory.for_session``), loop
set → get over 10 variables (a small JSON object each) for ``--seconds``; the baseline does
the same with raw redis-py ``SET``/``GET`` of the same bytes, same concurrency, same shared
client (one connection per agent in flight). The two alternate in ``--rounds`` rounds, so noise
from the rest of the machine hits both alike; a 1 s warm-up of each is not counted. One Python
process (one event loop) drives every agent, as an agent host would.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
from harness import (
    DEFAULT_REDIS_URL,
    cancel_on_sigterm,
    cleanup,
    invocation,
    markdown_table,
    percentile,
    ratio,
    unique_prefix,
)
from redis.asyncio import Redis

from worker.memory import WorkingMemory
from worker.settings import Settings

VALUE = {"step": 7, "note": "x" * 32, "tags": ["a", "b"]}
KEYS = 10

Op = Callable[[int], Awaitable[object]]


@dataclass
class Tally:
    ops: int = 0
    seconds: float = 0.0
    get_us: list[float] = field(default_factory=list)
    set_us: list[float] = field(default_factory=list)


async def hammer(agents: list[tuple[Op, Op]], seconds: float, tally: Tally | None) -> None:
    """Every agent loops set, get until ``seconds`` have passed; record into ``tally``."""
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)

    async def agent(set_op: Op, get_op: Op) -> None:
        i = 0
        while clock() < deadline:
            start = clock()
            await set_op(i)
            middle = clock()
            await get_op(i)
            end = clock()
            if tally is not None:
                tally.set_us.append((middle - start) / 1000)
                tally.get_us.append((end - middle) / 1000)
                tally.ops += 2
            i += 1

    started = clock()
    await asyncio.gather(*(agent(s, g) for s, g in agents))
    if tally is not None:
        tally.seconds += (clock() - started) / 1e9


async def run(url: str, agents: int, seconds: float, rounds: int) -> tuple[Tally, Tally]:
    cancel_on_sigterm()
    prefix = unique_prefix("agents")
    settings = Settings(redis_url=url, stream_prefix=prefix)
    redis = Redis.from_url(url, max_connections=agents + 10)
    payload = orjson.dumps(VALUE)
    memories = [
        await WorkingMemory.for_session(
            f"agent-{n}", project_id="bench", redis=redis, settings=settings
        )
        for n in range(agents)
    ]

    def ours(memory: WorkingMemory) -> tuple[Op, Op]:
        return (
            lambda i: memory.set(f"k{i % KEYS}", VALUE),
            lambda i: memory.get(f"k{i % KEYS}"),
        )

    def raw(n: int) -> tuple[Op, Op]:
        return (
            lambda i: redis.set(f"{prefix}:raw:{n}:k{i % KEYS}", payload),
            lambda i: redis.get(f"{prefix}:raw:{n}:k{i % KEYS}"),
        )

    working = [ours(m) for m in memories]
    plain = [raw(n) for n in range(agents)]
    tallies = Tally(), Tally()
    try:
        await hammer(working, 1.0, None)
        await hammer(plain, 1.0, None)
        for _round in range(rounds):
            await hammer(working, seconds / rounds, tallies[0])
            await hammer(plain, seconds / rounds, tallies[1])
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    return tallies


def row(label: str, tally: Tally, base: Tally) -> list[str]:
    rate, base_rate = tally.ops / tally.seconds, base.ops / base.seconds
    every, base_every = tally.get_us + tally.set_us, base.get_us + base.set_us
    p99 = percentile(every, 99)
    return [
        label,
        f"{tally.ops:,}",
        f"{rate:,.0f}",
        f"{percentile(every, 50):,.0f} µs",
        f"{p99:,.0f} µs",
        f"{percentile(tally.get_us, 99):,.0f} µs",
        f"{percentile(tally.set_us, 99):,.0f} µs",
        ratio(rate, base_rate),
        ratio(p99, percentile(base_every, 99)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured, per side")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ours, raw = asyncio.run(run(args.redis_url, args.agents, args.seconds, args.rounds))
    print(f"command: `{invocation()}`")
    print()
    print(
        f"{os.cpu_count()} CPUs · Python {platform.python_version()} · {args.agents} agents "
        f"(asyncio tasks, one session each) in one process, {args.seconds:g} s per side in "
        f"{args.rounds} alternating rounds · an op is one get or one set · ratio = this row ÷ "
        "raw redis-py (ops/s: > 1 is faster; p99: < 1 is faster)"
    )
    print()
    header = [
        "what ran",
        "ops",
        "ops/s",
        "p50",
        "p99",
        "get p99",
        "set p99",
        "ops/s ratio",
        "p99 ratio",
    ]
    rows = [
        row("`WorkingMemory` get/set", ours, raw),
        row("baseline: raw redis-py GET/SET", raw, raw),
    ]
    print(markdown_table(header, rows, "lrrrrrrrr"))


if __name__ == "__main__":
    main()
