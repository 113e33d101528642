"""End-to-end latency at a steady offered load: command → result, and result → episode.

    .venv/bin/python bench/latency.py [--redis-url URL] [--database-url URL] \\
        [--rate 1000] [--seconds 20] [--warmup 2]

An open-loop publisher XADDs commands at ``--rate`` per second on a fixed schedule (it never
waits for a result, so a slow consumer cannot slow the offered load down) — sessions cycle
spawn (10 variables) → pause → resume → terminate (consolidate) with ``seq`` — and notes each
send time; a reader XREADs the results stream and takes latency = result seen − command sent.
For episodes, latency = the ``episode.recorded`` entry's id time − the result entry's id time
(stream ids carry the server's millisecond clock, so no clocks are compared across processes).

Phases (``--phases``), each against fresh streams, with services as subprocesses:

- ``alone``: ``memworker run`` (command → result);
- ``consolidating``: ``memworker run`` + ``memworker consolidate`` (both latencies);
- ``baseline``: a plain FastStream per-message subscriber (``bench/baselines.py subscriber``);
- ``floor``: no service; the reader reads the commands themselves: what the machine and this
  harness add by themselves;
- ``naive``: ``memworker run`` + a per-entry consolidator (``bench/baselines.py consolidator``),
  the baseline of result → episode.

The first ``--warmup`` seconds of each phase are not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from harness import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    KINDS,
    baseline_command,
    cancel_on_sigterm,
    cleanup,
    command,
    fresh_database,
    invocation,
    markdown_table,
    memworker_command,
    percentile,
    ratio,
    service_env,
    services,
    stream_ms,
    unique_prefix,
    wait_for_consumers,
)
from redis.asyncio import Redis

from worker.keys import CONSOLIDATION_GROUP, LIFECYCLE_GROUP, StreamKeys, episodes_stream

WAIT_AFTER_SECONDS = 30.0
PHASES = ("alone", "consolidating", "baseline", "floor", "naive")


@dataclass
class Phase:
    label: str
    commands: list[list[str]]
    consolidating: bool = False
    floor: bool = False  # no service: the reader reads the commands themselves


@dataclass
class Measured:
    sent: int = 0
    send_seconds: float = 0.0
    results: list[float] = field(default_factory=list)  # ms, commands sent after the warm-up
    episodes: list[float] = field(default_factory=list)  # ms, sessions started after it
    missing_results: int = 0
    missing_episodes: int = 0


async def drive(
    redis_url: str, prefix: str, phase: Phase, rate: float, seconds: float, warmup: float
) -> Measured:
    """Publish at ``rate`` for ``warmup + seconds``; collect both latencies."""
    streams = StreamKeys(prefix, 0)
    watched = streams.lifecycle if phase.floor else streams.results
    project = "p" + uuid.uuid4().hex[:8]  # result and episode ids differ from other phases'
    total = int(rate * (warmup + seconds)) // 4 * 4
    counted_from = int(rate * warmup) // 4 * 4  # first measured command: a whole session
    sessions = total // 4
    publisher, reader = Redis.from_url(redis_url), Redis.from_url(redis_url)
    sent_ns: dict[str, int] = {}
    out = Measured()
    result_ms: dict[str, int] = {}  # counted agent.terminated event_id → its entry's ms
    episode_at: list[tuple[str, int]] = []  # (causation_id, entry ms)
    seen = 0

    async def publish() -> None:
        interval = 1e9 / rate
        start = time.perf_counter_ns()
        for k in range(total):
            delay = start + int(k * interval) - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            n, i = divmod(k, 4)
            body = command(KINDS[i], n, i + 1, project=project)
            data = orjson.dumps(body)
            sent_ns[body["event_id"]] = time.perf_counter_ns()
            await publisher.xadd(streams.lifecycle, {"data": data})
        out.sent = total
        out.send_seconds = (time.perf_counter_ns() - start) / 1e9

    async def read_results() -> None:
        nonlocal seen
        last: bytes | str = "0-0"
        while seen < total:
            reply: Any = await reader.xread({watched: last}, count=1000, block=100)
            now = time.perf_counter_ns()
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    seen += 1
                    body = orjson.loads(fields[b"data"])
                    cause = body.get("causation_id") or body["event_id"]
                    session, seq = cause[1:].rsplit("-", 1)
                    if int(session) * 4 + int(seq) - 1 < counted_from:
                        continue
                    out.results.append((now - sent_ns[cause]) / 1e6)
                    if body["type"] == "agent.terminated":
                        result_ms[body["event_id"]] = stream_ms(entry_id)

    async def read_episodes() -> None:
        last: bytes | str = "0-0"
        while len(episode_at) < sessions:
            reply: Any = await reader.xread({episodes_stream(prefix): last}, count=1000, block=100)
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    body = orjson.loads(fields[b"data"])
                    episode_at.append((body["causation_id"], stream_ms(entry_id)))

    readers = [asyncio.create_task(read_results())]
    if phase.consolidating:
        readers.append(asyncio.create_task(read_episodes()))
    try:
        await publish()
        done, _pending = await asyncio.wait(readers, timeout=WAIT_AFTER_SECONDS)
        for task in done:
            task.result()
    finally:
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await publisher.aclose()
        await reader.aclose()
    out.missing_results = total - seen
    if phase.consolidating:
        out.missing_episodes = sessions - len(episode_at)
        out.episodes = [float(at - result_ms[c]) for c, at in episode_at if c in result_ms]
    return out


async def run_phase(
    phase: Phase, redis_url: str, database_url: str | None, args: argparse.Namespace
) -> Measured:
    prefix = unique_prefix("latency")
    streams = StreamKeys(prefix, 0)
    redis = Redis.from_url(redis_url)
    env = service_env(redis_url, prefix, database_url)
    try:
        with services(phase.commands, env) as procs:
            if procs:
                await wait_for_consumers(redis, [streams.lifecycle], LIFECYCLE_GROUP, 1, procs)
            if phase.consolidating:
                await wait_for_consumers(redis, [streams.results], CONSOLIDATION_GROUP, 1, procs)
            return await drive(redis_url, prefix, phase, args.rate, args.seconds, args.warmup)
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()


def ms(value: float) -> str:
    return f"{value:,.2f} ms" if value == value else "n/a"


def latency_row(
    label: str, samples: Sequence[float], missing: int, base: Sequence[float] | None
) -> list[str]:
    p50, p99, p999 = (percentile(samples, q) for q in (50, 99, 99.9))
    row = [label, f"{len(samples):,}", f"{missing:,}", ms(p50), ms(p99), ms(p999)]
    row.append(ms(max(samples, default=float("nan"))))
    if base is None:
        return [*row, "1.00×", "1.00×"]
    return [*row, ratio(p50, percentile(base, 50)), ratio(p99, percentile(base, 99))]


async def main() -> None:
    cancel_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="commands per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    parser.add_argument(
        "--phases",
        nargs="+",
        choices=PHASES,
        default=list(PHASES),
        help="which phases to run (default: all)",
    )
    args = parser.parse_args()

    worker = memworker_command("run")
    phases = {
        "alone": Phase("`memworker run`", [worker]),
        "consolidating": Phase(
            "`memworker run` + `memworker consolidate`",
            [worker, memworker_command("consolidate")],
            consolidating=True,
        ),
        "baseline": Phase(
            "baseline: FastStream per-message subscriber", [baseline_command("subscriber")]
        ),
        "floor": Phase("floor: no worker, the reader reads the commands back", [], floor=True),
        "naive": Phase(
            "`memworker run` + baseline: per-entry consolidator",
            [worker, baseline_command("consolidator")],
            consolidating=True,
        ),
    }
    chosen = [name for name in phases if name in args.phases]
    measured: dict[str, Measured] = {}
    async with fresh_database(args.database_url) as database_url:
        for name in chosen:
            measured[name] = await run_phase(phases[name], args.redis_url, database_url, args)

    empty = Measured()
    base = measured["baseline"].results if "baseline" in measured else None
    command_rows = [
        latency_row(
            phases[name].label,
            measured[name].results,
            measured[name].missing_results,
            None if name == "baseline" else base or [],
        )
        for name in chosen
        if name != "naive"
    ]
    ours, naive = measured.get("consolidating", empty), measured.get("naive")
    episode_rows = [
        latency_row(
            "`memworker consolidate`",
            ours.episodes,
            ours.missing_episodes,
            naive.episodes if naive else [],
        )
    ]
    if naive:
        episode_rows.append(
            latency_row(
                "baseline: per-entry consolidator", naive.episodes, naive.missing_episodes, None
            )
        )
    print(f"command: `{invocation()}`")
    print()
    print(
        f"{os.cpu_count()} CPUs · Python {platform.python_version()} · offered "
        f"{args.rate:,.0f} commands/s for {args.warmup:g} s warm-up + {args.seconds:g} s measured "
        "per phase, open loop · every service a subprocess · ratio = this row ÷ the baseline "
        "(< 1 is faster). The floor row is what this machine and this harness add by themselves "
        "(an XADD and an XREAD of the same stream, no worker): the part of a latency no worker "
        "can remove."
    )
    print()
    print("Command → result (XADD of the command to the result seen by an XREAD reader):")
    print()
    header = [
        "what ran",
        "measured",
        "late",
        "p50",
        "p99",
        "p99.9",
        "max",
        "p50 ratio",
        "p99 ratio",
    ]
    print(markdown_table(header, command_rows, "lrrrrrrrr"))
    print()
    if "consolidating" in measured or "naive" in measured:
        print(
            "Result → episode row (result entry id time to `episode.recorded` entry id time, "
            "1 ms resolution; the event is published after the COMMIT):"
        )
        print()
        print(markdown_table(header, episode_rows, "lrrrrrrrr"))
        print()
    achieved = ", ".join(
        f"{name} {m.sent / m.send_seconds:,.0f}/s" for name, m in measured.items() if m.send_seconds
    )
    print(
        f"*late*: not seen within {WAIT_AFTER_SECONDS:g} s after the last command was sent (of "
        "the whole phase, warm-up included): a service that cannot keep up with the offered rate "
        "falls further behind as the phase goes on, and its percentiles cover only what arrived. "
        f"Offered rate achieved per phase: {achieved}."
    )
    if "alone" in measured:
        p99 = percentile(measured["alone"].results, 99)
        verdict = "met" if p99 < 5 else "not met"
        print(f"Target p99 < 5 ms (`memworker run`): {verdict} ({p99:.2f} ms).")


if __name__ == "__main__":
    asyncio.run(main())
